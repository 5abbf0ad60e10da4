//! Lets this crate's test and example binaries find libmoe_ep at run time
//! without LD_LIBRARY_PATH: moe-ep-sys reports the directory it linked from
//! (its `links = "moe_ep"` metadata arrives here as DEP_MOE_EP_LIB_DIR).
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_MOE_EP_LIB_DIR");
    if let Ok(dir) = std::env::var("DEP_MOE_EP_LIB_DIR") {
        println!("cargo:rustc-link-arg-tests=-Wl,-rpath,{dir}");
        println!("cargo:rustc-link-arg-examples=-Wl,-rpath,{dir}");
    }
}
