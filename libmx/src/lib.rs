//! libmyriexpress: the MX ABI (MX_API 0x301) for unmodified MX applications.
