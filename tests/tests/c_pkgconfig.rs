//! `libnerva-client/install.sh` installs the library, the header and a pkg-config file; the
//! installed tree must be enough to build and run a C program with nothing but
//! `pkg-config --cflags --libs nerva-client`.

mod c_support;

use std::path::Path;
use std::process::Command;

use c_support::{profile_dir, scratch_dir, workspace_root};

fn pkg_config(pc_dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("pkg-config")
        .env("PKG_CONFIG_PATH", pc_dir)
        .env_remove("PKG_CONFIG_LIBDIR")
        .args(args)
        .arg("nerva-client")
        .output()
        .ok()?;
    assert!(
        out.status.success(),
        "pkg-config {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(
        String::from_utf8(out.stdout)
            .expect("UTF-8")
            .trim()
            .to_owned(),
    )
}

#[test]
fn installed_tree_builds_and_runs_the_example_through_pkg_config() {
    // Make sure the libraries of this build exist before installing them.
    c_support::built_library("libnerva_client.so");
    c_support::built_library("libnerva_client.a");
    let profile = profile_dir();
    let target_dir = profile.parent().expect("target dir");
    let profile_name = profile
        .file_name()
        .and_then(|n| n.to_str())
        .expect("profile name");
    let prefix = scratch_dir("install");

    let install = Command::new("sh")
        .arg(workspace_root().join("libnerva-client/install.sh"))
        .arg(&prefix)
        .args(["--no-build", "--profile", profile_name, "--target-dir"])
        .arg(target_dir)
        .output()
        .expect("run install.sh");
    assert!(
        install.status.success(),
        "install.sh failed:\n{}{}",
        String::from_utf8_lossy(&install.stdout),
        String::from_utf8_lossy(&install.stderr)
    );
    for file in [
        "lib/libnerva_client.so",
        "lib/libnerva_client.a",
        "include/nerva.h",
        "lib/pkgconfig/nerva-client.pc",
    ] {
        assert!(
            prefix.join(file).is_file(),
            "install.sh did not install {file}"
        );
    }
    let installed_header = std::fs::read(prefix.join("include/nerva.h")).expect("read");
    let header = std::fs::read(workspace_root().join("include/nerva.h")).expect("read");
    assert_eq!(
        installed_header, header,
        "installed header differs from include/nerva.h"
    );

    // The .pc file itself: every placeholder filled in, the version of this build.
    let pc_dir = prefix.join("lib/pkgconfig");
    let pc = std::fs::read_to_string(pc_dir.join("nerva-client.pc")).expect("read .pc");
    assert!(
        !pc.contains('@'),
        "unfilled placeholder in nerva-client.pc:\n{pc}"
    );
    assert!(
        pc.lines()
            .any(|l| l == format!("Version: {}", env!("CARGO_PKG_VERSION"))),
        "wrong version in nerva-client.pc:\n{pc}"
    );
    assert!(pc.contains(&format!("prefix={}", prefix.display())), "{pc}");
    assert!(
        pc.contains("-lpthread"),
        "Libs.private lacks Rust std's native libraries:\n{pc}"
    );

    // pkg-config is part of CI's toolchain (apt-get install -y pkg-config); without it the
    // flags are read from the file as pkg-config would print them.
    let (cflags, libs) = match pkg_config(&pc_dir, &["--cflags"]) {
        Some(cflags) => {
            let libs = pkg_config(&pc_dir, &["--libs"]).expect("pkg-config ran once already");
            let static_libs = pkg_config(&pc_dir, &["--static", "--libs"]).expect("ran");
            assert!(static_libs.contains("-lpthread"), "--static: {static_libs}");
            (cflags, libs)
        }
        None => {
            eprintln!("pkg-config is not installed: using the .pc fields directly");
            (
                format!("-I{}/include", prefix.display()),
                format!("-L{}/lib -lnerva_client", prefix.display()),
            )
        }
    };
    assert_eq!(cflags, format!("-I{}/include", prefix.display()));
    assert_eq!(libs, format!("-L{}/lib -lnerva_client", prefix.display()));

    // Build the example from the installed tree only, and run it: with no daemon at the given
    // socket it must fail cleanly with the library's "not connected" message.
    let exe = prefix.join("stream");
    let mut link: Vec<String> = cflags.split_whitespace().map(str::to_owned).collect();
    link.extend(libs.split_whitespace().map(str::to_owned));
    link.push(format!("-Wl,-rpath,{}/lib", prefix.display()));
    c_support::compile_example("stream", &exe, &link);
    let run = Command::new(&exe)
        .arg(prefix.join("no-daemon.sock"))
        .output()
        .expect("run the example");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "stderr: {stderr}");
    assert!(
        stderr.contains("connect: not connected"),
        "stderr: {stderr}"
    );

    let _ = std::fs::remove_dir_all(&prefix);
}
