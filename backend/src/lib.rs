//! xmx dom0 side: xenbus backend of device `xmx`, ring service, MX engine and NIC I/O.
