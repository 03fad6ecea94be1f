//! Test certificates, made with the openssl command line: CAs and leaf certificates for
//! 127.0.0.1/localhost, as PEM files in a directory.
#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const EC: [&str; 5] = [
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:prime256v1",
    "-nodes",
];

/// `<name>.crt` and `<name>.key`: a self-signed CA.
pub fn make_ca(dir: &Path, name: &str) {
    let (crt, key, subject) = (
        format!("{name}.crt"),
        format!("{name}.key"),
        format!("/CN={name}"),
    );
    openssl(
        dir,
        &[
            &["req", "-x509"][..],
            &EC,
            &[
                "-keyout", &key, "-out", &crt, "-days", "1", "-subj", &subject,
            ],
        ]
        .concat(),
    );
}

/// `<name>.crt` and `<name>.key` signed by CA `ca`, valid for 127.0.0.1 and localhost, usable by
/// a server and a client.
pub fn make_leaf(dir: &Path, ca: &str, name: &str) {
    let (crt, key, csr, ext) = (
        format!("{name}.crt"),
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.ext"),
    );
    openssl(
        dir,
        &[
            &["req"][..],
            &EC,
            &[
                "-keyout",
                &key,
                "-out",
                &csr,
                "-subj",
                &format!("/CN={name}"),
            ],
        ]
        .concat(),
    );
    std::fs::write(
        dir.join(&ext),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n",
    )
    .unwrap();
    let (ca_crt, ca_key) = (format!("{ca}.crt"), format!("{ca}.key"));
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca_crt,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "1",
            "-extfile",
            &ext,
        ],
    );
}
