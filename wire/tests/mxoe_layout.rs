//! Pins every MXoE structure size, field offset and protocol constant to the
//! packed layouts MX and Open-MX put on the wire (MX wire-compatible mode).

use xmx_wire::mxoe::{self, *};

#[test]
fn protocol_constants() {
    assert_eq!(ETHERTYPE, 0x86DF);
    assert_eq!(ETH_HEADER_LEN, 14);
    assert_eq!(HEAD_LEN, 16);
    assert_eq!(ETH_FRAME_LEN_MIN, 60);
    assert_eq!(TINY_MSG_LEN_MAX, 32);
    assert_eq!(SMALL_MSG_LEN_MAX, 128);
    assert_eq!(MEDIUM_MSG_LEN_MAX, 32768);
    assert_eq!(MEDIUM_FRAG_LEN_MAX, 4096);
    assert_eq!(MEDIUM_FRAG_LEN_SHIFT, 12);
    assert_eq!(1usize << MEDIUM_FRAG_LEN_SHIFT, MEDIUM_FRAG_LEN_MAX);
    assert_eq!(MEDIUM_FRAGS_MAX, 8);
    assert_eq!(PULL_REPLY_LEN_MAX, 4096);
    assert_eq!(PULL_REPLIES_PER_BLOCK, 8);
    assert_eq!(PULL_BLOCK_LEN_MAX, 32768);
    assert_eq!(FRAME_LEN_MAX, 16 + 32 + 4096);
    assert_eq!(MTU_MIN, 4130);
    assert_eq!(RAW_FRAME_LEN_MAX, 1024);
    assert_eq!(RAW_PAYLOAD_LEN_MAX, 1024 - 17);
    assert_eq!(ENDPOINTS_PER_NIC, 256);
    assert_eq!(PEERS_MAX, 65536);
    assert_eq!(HOST_QUERY_MAGIC, 0x1305_2008);
    assert_eq!(HOSTNAME_LEN_MAX, 80);
    assert_eq!(TRUC_DATA_TYPE_ACK, 0x55);
}

#[test]
fn structure_sizes() {
    assert_eq!(HOST_QUERY_LEN, 16);
    assert_eq!(HOST_REPLY_LEN, 16);
    assert_eq!(TRUC_LEN, 28);
    assert_eq!(TRUC_LIBACK_DATA_LEN, 16);
    assert_eq!(CONNECT_LEN, 32);
    assert_eq!(CONNECT_DATA_LEN, 16);
    assert_eq!(MSG_LEN, 24);
    assert_eq!(MEDIUM_LEN, 32);
    assert_eq!(RNDV_LEN, 32);
    assert_eq!(RNDV_DATA_LEN, 8);
    assert_eq!(PULL_LEN, 32);
    assert_eq!(PULL_REPLY_LEN, 16);
    assert_eq!(NOTIFY_LEN, 24);
    assert_eq!(NACK_LIB_LEN, 16);
    assert_eq!(NACK_MCP_LEN, 16);
    // The largest fixed header plus the head still fits a minimum Ethernet frame.
    const { assert!(HEAD_LEN + 32 <= ETH_FRAME_LEN_MIN) };
}

#[test]
fn head_offsets() {
    use mxoe::head::field::*;
    assert_eq!(
        (DST, SRC, ETHERTYPE, DST_SRC_PEER_INDEX, LEN),
        (0, 6, 12, 14, 16)
    );
}

#[test]
fn host_offsets() {
    use mxoe::host::field::*;
    assert_eq!(
        (
            PTYPE,
            LENGTH,
            SRC_DST_PEER_INDEX,
            PAD0,
            MAGIC,
            PAD1,
            LEN,
            HOSTNAME
        ),
        (0, 1, 2, 4, 8, 12, 16, 16)
    );
}

#[test]
fn truc_offsets() {
    use mxoe::truc::field::*;
    assert_eq!(
        (
            PTYPE,
            DST_ENDPOINT,
            SRC_ENDPOINT,
            SRC_GENERATION,
            LENGTH,
            PAD1,
            SESSION
        ),
        (0, 1, 2, 3, 4, 5, 8)
    );
    assert_eq!(
        (DATA, DATA_TYPE, LIBACK_PAD, LIBACK_LIB_SEQNUM),
        (12, 12, 13, 14)
    );
    assert_eq!(
        (
            LIBACK_SESSION_ID,
            LIBACK_ACKNUM,
            LIBACK_SEND_SEQ,
            LIBACK_RESENT,
            LIBACK_PAD1
        ),
        (16, 20, 24, 26, 27)
    );
    assert_eq!((LIBACK_DATA_LEN, LEN), (16, 28));
}

#[test]
fn connect_offsets() {
    use mxoe::connect::field::*;
    assert_eq!(
        (
            PTYPE,
            DST_ENDPOINT,
            SRC_ENDPOINT,
            SRC_GENERATION,
            LENGTH,
            PAD1
        ),
        (0, 1, 2, 3, 4, 5)
    );
    assert_eq!(
        (LIB_SEQNUM, SRC_DST_PEER_INDEX, PAD2, DATA),
        (8, 10, 12, 16)
    );
    assert_eq!(
        (SRC_SESSION_ID, REQUEST_APP_KEY, REPLY_TARGET_SESSION_ID),
        (16, 20, 20)
    );
    assert_eq!(
        (TARGET_RECV_SEQNUM_START, IS_REPLY, CONNECT_SEQNUM),
        (24, 26, 27)
    );
    assert_eq!((REQUEST_PAD, REPLY_STATUS, REPLY_PAD), (28, 28, 29));
    assert_eq!((DATA_LEN, LEN), (16, 32));
}

#[test]
fn msg_offsets() {
    use mxoe::msg::field::*;
    assert_eq!(
        (
            PTYPE,
            DST_ENDPOINT,
            SRC_ENDPOINT,
            SRC_GENERATION,
            LENGTH,
            CHECKSUM
        ),
        (0, 1, 2, 3, 4, 6)
    );
    assert_eq!(
        (
            LIB_SEQNUM,
            LIB_PIGGYACK,
            MATCH_A,
            MATCH_B,
            SESSION,
            LEN,
            DATA
        ),
        (8, 10, 12, 16, 20, 24, 24)
    );
}

#[test]
fn medium_offsets() {
    use mxoe::medium::field::*;
    assert_eq!(
        (
            PTYPE,
            DST_ENDPOINT,
            SRC_ENDPOINT,
            SRC_GENERATION,
            LENGTH,
            PAD
        ),
        (0, 1, 2, 3, 4, 6)
    );
    assert_eq!(
        (LIB_SEQNUM, LIB_PIGGYACK, MATCH_A, MATCH_B, SESSION),
        (8, 10, 12, 16, 20)
    );
    assert_eq!(
        (
            FRAG_LENGTH,
            FRAG_SEQNUM,
            FRAG_PIPELINE,
            CHECKSUM,
            PAD2,
            LEN,
            DATA
        ),
        (24, 26, 27, 28, 30, 32, 32)
    );
}

#[test]
fn rndv_offsets() {
    use mxoe::rndv::field::*;
    assert_eq!(
        (LENGTH, CHECKSUM, MATCH_A, MATCH_B, SESSION),
        (4, 6, 12, 16, 20)
    );
    assert_eq!(
        (
            MSG_LENGTH,
            PULLED_RDMA_ID,
            PULLED_RDMA_SEQNUM,
            PULLED_RDMA_OFFSET
        ),
        (24, 28, 29, 30)
    );
    assert_eq!((DATA_LEN, LEN), (8, 32));
}

#[test]
fn pull_offsets() {
    use mxoe::pull::field::*;
    assert_eq!(
        (PTYPE, DST_ENDPOINT, SRC_ENDPOINT, SRC_GENERATION, SESSION),
        (0, 1, 2, 3, 4)
    );
    assert_eq!(
        (
            TOTAL_LENGTH,
            PULLED_RDMA_ID,
            PULLED_RDMA_SEQNUM,
            PULLED_RDMA_OFFSET
        ),
        (8, 12, 13, 14)
    );
    assert_eq!((SRC_PULL_HANDLE, SRC_MAGIC), (16, 20));
    assert_eq!(
        (FIRST_FRAME_OFFSET, BLOCK_LENGTH, FRAME_INDEX, LEN),
        (24, 26, 28, 32)
    );
}

#[test]
fn pull_reply_offsets() {
    use mxoe::pull::reply_field::*;
    assert_eq!(
        (
            PTYPE,
            FRAME_SEQNUM,
            FRAME_LENGTH,
            MSG_OFFSET,
            DST_PULL_HANDLE,
            DST_MAGIC
        ),
        (0, 1, 2, 4, 8, 12)
    );
    assert_eq!((LEN, DATA), (16, 16));
}

#[test]
fn notify_offsets() {
    use mxoe::notify::field::*;
    assert_eq!(
        (
            PTYPE,
            DST_ENDPOINT,
            SRC_ENDPOINT,
            SRC_GENERATION,
            SESSION,
            TOTAL_LENGTH
        ),
        (0, 1, 2, 3, 4, 8)
    );
    assert_eq!(
        (PULLED_RDMA_ID, PULLED_RDMA_SEQNUM, PAD1, PAD2),
        (12, 13, 14, 16)
    );
    assert_eq!((LIB_SEQNUM, LIB_PIGGYACK, PAD3, LEN), (18, 20, 22, 24));
}

#[test]
fn nack_offsets() {
    {
        use mxoe::nack::lib_field::*;
        assert_eq!(
            (PTYPE, SRC_ENDPOINT, SRC_GENERATION, NACK_TYPE, PAD1, PAD2),
            (0, 1, 2, 3, 4, 8)
        );
        assert_eq!(
            (DST_ENDPOINT, DST_SRC_PEER_INDEX, LIB_SEQNUM, PAD3, LEN),
            (9, 10, 12, 14, 16)
        );
    }
    {
        use mxoe::nack::mcp_field::*;
        assert_eq!(
            (PTYPE, SRC_ENDPOINT, SRC_GENERATION, NACK_TYPE, PAD1),
            (0, 1, 2, 3, 4)
        );
        assert_eq!((SRC_PULL_HANDLE, SRC_MAGIC, LEN), (8, 12, 16));
    }
}

#[test]
fn raw_offsets() {
    use mxoe::raw::field::*;
    assert_eq!((PTYPE, PAYLOAD, LEN), (0, 1, 1));
}
