//! Lets `cargo test` run this crate's unit tests: they link the machine's libpython (the `extension-module`
//! feature is off outside maturin), so the test binary gets an rpath to it.

fn main() {
    pyo3_build_config::add_libpython_rpath_link_args();
}
