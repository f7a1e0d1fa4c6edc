//! Generates the Rust types of the vendored `proto/onnx.proto` (ONNX 1.23, proto2)
//! with `prost-build`, parsing the schema with `protox` so no system `protoc` is
//! needed. The generated module is included by `src/proto.rs`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/onnx.proto");
    let fds = protox::compile(["onnx.proto"], ["proto"])?;
    prost_build::Config::new().compile_fds(fds)?;
    Ok(())
}
