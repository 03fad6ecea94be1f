//! docs/configuration.md lists every flag of every command, with its variable and default, as the
//! binary's own command line defines them: the reference is rendered from clap here and must
//! equal the block between the markers in the document. When a flag changes, the test fails
//! showing the new block; `UPDATE_DOCS=1 cargo test --test local config_reference` writes it.

use clap::CommandFactory;
use portcullis::settings::Cli;

const DOC: &str = "docs/configuration.md";
const BEGIN: &str = "<!-- flag reference: generated from the command line by tests/local/config_reference.rs \
                     (UPDATE_DOCS=1 cargo test --test local config_reference) -->";
const END: &str = "<!-- end of the flag reference -->";

/// A table cell: one line, pipes escaped.
fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

fn render() -> String {
    let cli = Cli::command();
    let mut out = String::new();
    for command in cli.get_subcommands() {
        let name = command.get_name();
        out.push_str(&format!("\n### `portcullis {name}`\n\n"));
        if let Some(about) = command.get_about() {
            out.push_str(&format!("{}\n\n", cell(&about.to_string())));
        }
        out.push_str("| flag | variable | default | meaning |\n|---|---|---|---|\n");
        for arg in command.get_arguments() {
            if arg.is_hide_set() || matches!(arg.get_id().as_str(), "help" | "version") {
                continue;
            }
            let flag = match (arg.get_long(), arg.get_short()) {
                (Some(long), Some(short)) => format!("`-{short}`, `--{long}`"),
                (Some(long), None) => format!("`--{long}`"),
                (None, _) => format!("`{}` (argument)", arg.get_id().as_str().to_uppercase()),
            };
            let variable = arg
                .get_env()
                .map(|v| format!("`{}`", v.to_string_lossy()))
                .unwrap_or_else(|| "—".into());
            let defaults: Vec<String> = arg
                .get_default_values()
                .iter()
                .map(|v| format!("`{}`", v.to_string_lossy()))
                .collect();
            let default = if matches!(arg.get_action(), clap::ArgAction::SetTrue) {
                "off".to_owned()
            } else if defaults.is_empty() {
                "—".to_owned()
            } else {
                defaults.join(", ")
            };
            let meaning = arg
                .get_long_help()
                .or_else(|| arg.get_help())
                .map(|h| cell(&h.to_string()))
                .unwrap_or_default();
            out.push_str(&format!(
                "| {flag} | {variable} | {default} | {meaning} |\n"
            ));
        }
    }
    out
}

#[test]
fn the_flag_reference_is_the_binarys_own() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(DOC);
    let doc = std::fs::read_to_string(&path).expect("docs/configuration.md");
    let (Some(begin), Some(end)) = (doc.find(BEGIN), doc.find(END)) else {
        panic!("{DOC} lacks the markers:\n{BEGIN}\n{END}");
    };
    let current = &doc[begin + BEGIN.len()..end];
    let rendered = render();
    if current == rendered {
        return;
    }
    if std::env::var_os("UPDATE_DOCS").is_some() {
        let updated = format!("{}{BEGIN}{rendered}{}", &doc[..begin], &doc[end..]);
        std::fs::write(&path, updated).expect("write docs/configuration.md");
        return;
    }
    panic!(
        "{DOC}'s flag reference differs from the command line; run \
         `UPDATE_DOCS=1 cargo test --test local config_reference` (and read the diff). The reference \
         now:\n{rendered}"
    );
}

#[test]
fn every_flag_has_a_meaning_and_every_serve_flag_a_variable() {
    let cli = Cli::command();
    let mut missing = Vec::new();
    for command in cli.get_subcommands() {
        for arg in command.get_arguments() {
            if arg.is_hide_set() || matches!(arg.get_id().as_str(), "help" | "version") {
                continue;
            }
            let id = arg.get_id().as_str();
            if arg.get_help().is_none() {
                missing.push(format!("{} {id}: no help text", command.get_name()));
            }
            if command.get_name() == "serve" && arg.get_env().is_none() {
                missing.push(format!("serve {id}: no variable"));
            }
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}
