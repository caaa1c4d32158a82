//! Compiles the wire contract (`proto/magic_sync.proto`) with a pure-Rust
//! protobuf parser, so no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/magic_sync.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    prost_build::Config::new().compile_fds(descriptors)?;
    Ok(())
}
