// Run without LD_LIBRARY_PATH: record the directory moe-ep-sys linked
// libmoe_ep from as the binary's run path.  (Cargo passes a dependency's link
// arguments to no binary but the dependency's own, so the application says it.)
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_MOE_EP_LIB_DIR");
    if let Ok(dir) = std::env::var("DEP_MOE_EP_LIB_DIR") {
        println!("cargo:rustc-link-arg-bins=-Wl,-rpath,{dir}");
    }
}
