//! The MX protocol core, sans-IO: state machines that take bytes and time and return actions.
