//! Finds libmoe_ep and records the C compiler's view of the header's structs.
//!
//! Library: $MOE_EP_LIB_DIR (a directory holding libmoe_ep.so), else
//! `pkg-config --variable=libdir moe_ep`, else the directory an earlier run of
//! this script found (kept in $OUT_DIR, used while it still holds the library),
//! else the linker's default path (with a warning naming both variables).  So a
//! later `cargo build` or `cargo test` without the variable keeps linking, as
//! it would without this script rerunning: the script reruns when
//! PKG_CONFIG_PATH changes, to find a library it now points at.  For a
//! setting every cargo command sees, put MOE_EP_LIB_DIR in the [env] table of
//! .cargo/config.toml.  With the `mpi` feature, libmoe_ep_mpi too.
//! The directory is published to dependents as DEP_MOE_EP_LIB_DIR.
//! Header: $MOE_EP_INCLUDE_DIR, else the repository's include/ (this crate
//! lives at bindings/rust/moe-ep-sys).
//!
//! Layout: the C probe bindings/layout_probe/moe_ep_layout_probe.c is compiled
//! with $CC (default `cc`) and run; its output lands in $OUT_DIR/layout.txt for
//! tests/layout.rs.  No `cc` crate: CI cannot download crates.
use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn holds_library(dir: &str) -> bool {
    Path::new(dir).join("libmoe_ep.so").exists() || Path::new(dir).join("libmoe_ep.so.0").exists()
}

/// The directory an earlier run found, if it still holds the library.
fn remembered_libdir(memo: &Path) -> Option<String> {
    let dir = fs::read_to_string(memo).ok()?.trim().to_string();
    (!dir.is_empty() && holds_library(&dir)).then_some(dir)
}

fn pkg_config_libdir() -> Option<String> {
    let out = Command::new("pkg-config").args(["--variable=libdir", "moe_ep"]).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let dir = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!dir.is_empty()).then_some(dir)
}

/// Compiles and runs the probe; on any failure the file says why, so that the
/// layout test fails with that message instead of passing vacuously.
fn probe_layout(include: &Path, probe_src: &Path, out_dir: &Path) -> String {
    let cc = env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let exe = out_dir.join("moe_ep_layout_probe");
    let compiled = Command::new(&cc)
        .arg("-std=c99")
        .arg("-I")
        .arg(include)
        .arg(probe_src)
        .arg("-o")
        .arg(&exe)
        .output();
    match compiled {
        Err(e) => return format!("error cannot run C compiler `{cc}`: {e}\n"),
        Ok(o) if !o.status.success() => {
            return format!("error `{cc}` failed on {}: {}\n", probe_src.display(),
                           String::from_utf8_lossy(&o.stderr).replace('\n', " "))
        }
        Ok(_) => {}
    }
    match Command::new(&exe).output() {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        Ok(o) => format!("error probe exited with {}\n", o.status),
        Err(e) => format!("error cannot run probe: {e}\n"),
    }
}

fn main() {
    println!("cargo:rerun-if-env-changed=MOE_EP_LIB_DIR");
    println!("cargo:rerun-if-env-changed=MOE_EP_INCLUDE_DIR");
    println!("cargo:rerun-if-env-changed=CC");
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());

    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_LIBDIR");
    let memo = out_dir.join("moe_ep_lib_dir");
    let from_env = env::var("MOE_EP_LIB_DIR").ok().filter(|s| !s.is_empty());
    let from_pkg_config = if from_env.is_none() { pkg_config_libdir() } else { None };
    let located = from_env.is_some() || from_pkg_config.is_some();
    let lib_dir = from_env.clone().or(from_pkg_config).or_else(|| remembered_libdir(&memo));
    match &lib_dir {
        Some(dir) => {
            if located && !holds_library(dir) {
                let source = if from_env.is_some() { "MOE_EP_LIB_DIR" } else { "pkg-config moe_ep" };
                println!("cargo:warning=moe-ep-sys: {source} names {dir}, which holds no libmoe_ep.so");
            }
            if located && holds_library(dir) {
                // Remembered for later runs of this script without the variables.
                let _ = fs::write(&memo, dir);
            }
            println!("cargo:rustc-link-search=native={dir}");
            // Seen by the build scripts of crates that depend on this one as
            // DEP_MOE_EP_LIB_DIR: an application's build.rs turns it into a run
            // path (cargo passes link arguments of a dependency to no binary but
            // its own), see docs/ffi.md.
            println!("cargo:lib_dir={dir}");
            // This crate's own test binaries find the library without LD_LIBRARY_PATH.
            println!("cargo:rustc-link-arg-tests=-Wl,-rpath,{dir}");
        }
        None => println!(
            "cargo:warning=moe-ep-sys: libmoe_ep not located: MOE_EP_LIB_DIR is not set and \
             `pkg-config --variable=libdir moe_ep` found nothing; set MOE_EP_LIB_DIR=<prefix>/lib \
             or PKG_CONFIG_PATH=<prefix>/lib/pkgconfig (trying the linker's default path)"
        ),
    }
    println!("cargo:rustc-link-lib=dylib=moe_ep");
    if env::var_os("CARGO_FEATURE_MPI").is_some() {
        println!("cargo:rustc-link-lib=dylib=moe_ep_mpi");
    }

    let include = env::var("MOE_EP_INCLUDE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| manifest.join("../../../include"));
    let probe_src = manifest.join("../../layout_probe/moe_ep_layout_probe.c");
    println!("cargo:rerun-if-changed={}", include.join("moe_ep_c.h").display());
    println!("cargo:rerun-if-changed={}", probe_src.display());
    println!("cargo:include={}", include.display());
    let layout = probe_layout(&include, &probe_src, &out_dir);
    fs::write(out_dir.join("layout.txt"), layout).expect("write layout.txt");
}
