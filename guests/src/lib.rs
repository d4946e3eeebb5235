//! Guest-side services: the xmx-frontd daemon and simulated-cluster helpers.
