//! Cross-crate integration tests: the scenarios live under tests/tests/.
