//! Message classes: how a message of a given length travels.

// One definition of the classes and their limits: MXoE's, in xmx-wire.
pub use xmx_wire::mxoe::{
    MessageClass, MEDIUM_MSG_LEN_MAX as MEDIUM_MAX, SMALL_MSG_LEN_MAX as SMALL_MAX,
    TINY_MSG_LEN_MAX as TINY_MAX,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boundaries() {
        use MessageClass::*;
        let cases = [
            (0, Tiny),
            (32, Tiny),
            (33, Small),
            (128, Small),
            (129, Medium),
            (32768, Medium),
            (32769, Large),
        ];
        for (len, class) in cases {
            assert_eq!(MessageClass::of(len), class, "length {len}");
        }
    }
}
