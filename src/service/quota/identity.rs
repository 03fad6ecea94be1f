//! Who a stream is: a holder id for the quota store. A stream is its own holder (64 random
//! bits), unless its gateway names itself in a request header: then every stream of that
//! gateway, on every replica, is one holder. It must never give two names one id by design
//! (a fixed hash), nor accept a name it cannot bound.

use tonic::{Request, Status};

/// The request header by which a gateway names itself (Envoy: the RLQS cluster's
/// `grpc_service.initial_metadata`): its streams are then one holder, whichever replica each
/// reaches, and a stream that breaks leaves its holds for the next.
pub const IDENTITY_HEADER: &str = "x-portcullis-gateway-id";

/// The longest identity accepted.
const MAX_IDENTITY_BYTES: usize = 256;

/// The gateway's identity, if it sent one; a malformed one refuses the stream.
pub(super) fn identity<T>(request: &Request<T>) -> Result<Option<String>, Status> {
    let Some(value) = request.metadata().get(IDENTITY_HEADER) else {
        return Ok(None);
    };
    let text = value.to_str().map_err(|_| {
        Status::invalid_argument(format!("{IDENTITY_HEADER} is not printable ASCII"))
    })?;
    if text.is_empty() || text.len() > MAX_IDENTITY_BYTES {
        return Err(Status::invalid_argument(format!(
            "{IDENTITY_HEADER} must hold 1 to {MAX_IDENTITY_BYTES} bytes"
        )));
    }
    Ok(Some(text.to_owned()))
}

/// A named gateway's holder id: the same on every replica and release (64-bit FNV-1a of the
/// name: a fixed function, where std's hasher may change between Rust releases). Never 0.
pub(super) fn named_gateway_id(name: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in name.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash.max(1)
}

/// A stream's holder id: 64 random bits, unique across every replica sharing one Redis and
/// every restart (a prefix per replica and a counter gave 32 random bits, and a replica's
/// streams told apart by their counter only). Never 0.
pub(super) fn gateway_id() -> u64 {
    rand::random::<u64>().max(1)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_named_gateway_is_one_holder_on_every_replica_and_release() {
        // FNV-1a's published value for "a": a fixed function, not one Rust may change.
        assert_eq!(super::named_gateway_id("a"), 0xaf63_dc4c_8601_ec8c);
        assert_ne!(
            super::named_gateway_id("gateway-1"),
            super::named_gateway_id("gateway-2")
        );
    }

    #[test]
    fn an_identity_too_long_or_empty_refuses_the_stream() {
        let with = |value: &str| {
            let mut request = tonic::Request::new(());
            request
                .metadata_mut()
                .insert(super::IDENTITY_HEADER, value.parse().unwrap());
            super::identity(&request)
        };
        assert_eq!(with("gw-1").unwrap().as_deref(), Some("gw-1"));
        assert!(with("").is_err());
        assert!(with(&"x".repeat(257)).is_err());
        assert_eq!(super::identity(&tonic::Request::new(())).unwrap(), None);
    }

    #[test]
    fn every_stream_draws_all_64_bits_of_its_id() {
        let ids: Vec<u64> = (0..64).map(|_| super::gateway_id()).collect();
        let high: std::collections::HashSet<u64> = ids.iter().map(|id| id >> 32).collect();
        // 64 draws of 32 random high bits: all alike only by a chance of 2^-2016.
        assert!(high.len() > 1, "{ids:x?}");
        assert!(ids.iter().all(|&id| id != 0));
    }
}
