//! dlrmc (being written)
fn main() {}
