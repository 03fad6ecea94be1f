//! Compiles our own copy of the Envoy rate-limit protos with protox (pure Rust), so that building
//! Portcullis never needs a system `protoc`: the rate-limit service, the quota service (RLQS),
//! and the xDS stream and resource that carry rules from a control plane.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/envoy/service/ratelimit/v3/rls.proto",
        "proto/envoy/service/discovery/v3/ads.proto",
        "proto/envoy/service/rate_limit_quota/v3/rlqs.proto",
        "proto/ratelimit/config/ratelimit/v3/rls_conf.proto",
    ];
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
