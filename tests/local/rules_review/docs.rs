//! What the docs promise of `test` and `diff`: README's test file and diff, every documented test
//! file, the pre-commit hooks.

use super::*;

/// README's "Testing your rules": its test file is examples/tests/login.yaml, and its diff is what
/// `portcullis diff` prints for that pull request (logins taken to 3 a minute).
#[test]
fn the_readme_test_file_and_diff_are_real() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let section = &readme[readme.find("## Testing your rules").expect("the section")..];
    let block = |start: &str| {
        let at = section.find(start).expect("the block") + start.len();
        section[at..section[at..].find("```").unwrap() + at].to_owned()
    };
    let test_file = block("```yaml\n");
    assert_eq!(
        test_file,
        std::fs::read_to_string(root().join("examples/tests/login.yaml")).unwrap()
    );
    let printed = block("$ portcullis diff main/rules rules --tests tests\n");

    let work = tempfile::tempdir().unwrap();
    for dir in ["main/rules", "rules", "tests"] {
        std::fs::create_dir_all(work.path().join(dir)).unwrap();
    }
    for entry in std::fs::read_dir(root().join("examples/rules")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(work.path().join("main/rules").join(name), &text).unwrap();
        let changed = if name == "edge.yaml" {
            text.replace("requests_per_unit: 5\n", "requests_per_unit: 3\n")
        } else {
            text
        };
        std::fs::write(work.path().join("rules").join(name), changed).unwrap();
    }
    std::fs::write(work.path().join("tests/login.yaml"), &test_file).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_portcullis"))
        .args(["diff", "main/rules", "rules", "--tests", "tests"])
        .current_dir(work.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(String::from_utf8_lossy(&out.stdout), printed);
}

/// Every test file shown in README and docs/ (a YAML block with `cases:`) is one
/// `portcullis test` accepts.
#[test]
fn the_documented_test_files_parse() {
    let text = common::docs();
    let blocks: Vec<&str> = text
        .split("```yaml\n")
        .skip(1)
        .filter_map(|rest| rest.split_once("```").map(|(block, _)| block))
        .filter(|block| block.contains("\ncases:"))
        .collect();
    assert!(blocks.len() >= 2, "README's and docs/rules-testing.md's");
    for block in blocks {
        if let Err(errors) =
            portcullis::review::spec::parse(std::path::Path::new("doc.yaml"), block)
        {
            panic!("{errors:?}\n{block}");
        }
    }
}

/// The pre-commit hooks run our commands as pre-commit would: `entry` then the `args` a rules
/// repository gives (here the examples), without file names; a broken rules directory fails.
#[test]
fn the_pre_commit_hooks_run_check_and_test() {
    #[derive(serde::Deserialize)]
    struct Hook {
        id: String,
        entry: String,
        language: String,
        pass_filenames: bool,
    }
    let text = std::fs::read_to_string(root().join(".pre-commit-hooks.yaml")).unwrap();
    let hooks: Vec<Hook> = serde_saphyr::from_str(&text).expect("the hooks file");
    let ids: Vec<&str> = hooks.iter().map(|h| h.id.as_str()).collect();
    assert_eq!(ids, ["portcullis-check", "portcullis-test"]);
    let rules = root().join("examples/rules");
    let tests = root().join("examples/tests");
    let broken = dir_with(&[(
        "x.yaml",
        "domain: x\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
    )]);
    for hook in &hooks {
        assert_eq!(hook.language, "rust", "built from this repository");
        assert!(!hook.pass_filenames, "the commands take directories");
        let (program, subcommand) = hook.entry.split_once(' ').expect("program and subcommand");
        assert_eq!(program, "portcullis", "the binary cargo installs");
        let args: Vec<&str> = match subcommand {
            "check" => vec![s(&rules)],
            "test" => vec![s(&rules), s(&tests)],
            other => panic!("unexpected hook command {other}"),
        };
        let (code, out) = portcullis(&[&[subcommand], args.as_slice()].concat());
        assert_eq!(code, 0, "{}: {out}", hook.id);
        let mut failing = args.clone();
        failing[0] = s(broken.path());
        let (code, out) = portcullis(&[&[subcommand], failing.as_slice()].concat());
        assert_ne!(code, 0, "{}: {out}", hook.id);
        assert!(out.contains("x.yaml:4:"), "{}: {out}", hook.id);
    }
}
