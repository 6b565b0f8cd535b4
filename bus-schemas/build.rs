//! Generates the prost types from `proto/` with a vendored protoc, so a fresh machine needs
//! no system protoc.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rerun-if-env-changed=PROTOC");
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    config.compile_protos(&["proto/foldgate/v1/bus.proto"], &["proto"])?;
    Ok(())
}
