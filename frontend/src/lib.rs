//! xmx guest side: xenbus frontend of device `xmx`, endpoint channels, grants and the registration cache.
