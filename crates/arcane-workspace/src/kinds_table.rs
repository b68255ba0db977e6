//! The kinds table of `docs/engine-kinds.md`, written from the descriptors: what the
//! documentation says of each kind is what the code says, and a test keeps the two
//! equal.

use crate::engine::{DevicePlan, Engine, EngineKind, OwnedListen, Starts};

/// The markdown table of every kind in [`Engine::ALL`], one row each.
pub fn kinds_table() -> String {
    let mut text = String::from(
        "| kind | also | starts | listens (owned) | device | formats | API paths | `arcane/1` methods |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    for engine in Engine::ALL {
        text.push_str(&row(engine.kind()));
        text.push('\n');
    }
    text
}

fn row(kind: &dyn EngineKind) -> String {
    let cells = [
        format!("`{}`", kind.id()),
        ticked(kind.aliases().iter().copied()),
        starts(kind),
        listens(kind),
        device(kind.device_plan()).to_string(),
        list(kind.formats().iter().map(|f| {
            let carried = if f.bundled { " (bundled)" } else { "" };
            format!("{}{carried}", f.label)
        })),
        ticked(kind.api_paths().iter().copied()),
        methods(kind),
    ];
    format!("| {} |", cells.join(" | "))
}

fn starts(kind: &dyn EngineKind) -> String {
    let library = kind
        .needs_library()
        .map(|e| match e.kind().runtime_library() {
            Some(own) if e.as_str() == kind.id() => {
                format!(", loading its registered library (`{}`)", own.file)
            }
            _ => format!(", loading the registered `{e}` library"),
        })
        .unwrap_or_default();
    match kind.starts() {
        Starts::Server { executable } => format!("the registered `{executable}`{library}"),
        Starts::Worker => format!("Arcane's own worker processes{library}"),
        Starts::Builtin { subcommand } => format!("`arcane {subcommand}`{library}"),
        Starts::Command => format!("the `[[model]]`'s command line{library}"),
    }
}

fn listens(kind: &dyn EngineKind) -> String {
    if kind.starts() == Starts::Worker {
        return "pipes to the Core".into();
    }
    if kind.starts() == Starts::Command {
        return "as its placeholders say".into();
    }
    let default = match kind.default_listen() {
        OwnedListen::PrivateSocket => "private socket",
        OwnedListen::KeyedPort => "loopback port behind a key",
        OwnedListen::OpenPort => "loopback port, no key",
    };
    if kind.can_close_its_door() && kind.default_listen() != OwnedListen::KeyedPort {
        format!("{default}; a port behind a key for a `url`")
    } else {
        default.to_string()
    }
}

fn device(plan: DevicePlan) -> &'static str {
    match plan {
        DevicePlan::ArgsAndEnv => "the resolver's arguments and environment",
        DevicePlan::EnvOnly => "the resolver's environment",
        DevicePlan::EngineChooses => "its own choice (a selection is refused)",
        DevicePlan::CpuOnly => "the CPU only (a GPU target is refused)",
    }
}

fn methods(kind: &dyn EngineKind) -> String {
    let forwarded = kind.forwarded_methods().iter().map(|m| m.name);
    match kind.rpc_namespace() {
        Some(namespace) if kind.forwarded_methods().is_empty() => format!("`{namespace}.*`"),
        Some(_) => ticked(forwarded),
        None => "—".into(),
    }
}

fn ticked<'a>(items: impl Iterator<Item = &'a str>) -> String {
    list(items.map(|item| format!("`{item}`")))
}

fn list(items: impl Iterator<Item = String>) -> String {
    let items: Vec<String> = items.collect();
    if items.is_empty() {
        "—".into()
    } else {
        items.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const START: &str = "<!-- kinds table: written by arcane_workspace::kinds_table -->\n";
    const END: &str = "<!-- end of kinds table -->";

    #[test]
    fn the_documented_table_is_the_one_the_descriptors_write() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/engine-kinds.md");
        let doc = std::fs::read_to_string(path).expect("docs/engine-kinds.md");
        let documented = doc
            .split_once(START)
            .and_then(|(_, rest)| rest.split_once(END))
            .map(|(table, _)| table)
            .expect("docs/engine-kinds.md marks its kinds table");
        let written = kinds_table();
        assert!(
            documented == written,
            "docs/engine-kinds.md's kinds table differs from the descriptors; write it as:\n{written}"
        );
    }

    #[test]
    fn every_kind_has_a_row_naming_its_formats_and_paths() {
        let table = kinds_table();
        assert_eq!(table.lines().count(), Engine::ALL.len() + 2);
        for engine in Engine::ALL {
            let row = table
                .lines()
                .find(|l| l.starts_with(&format!("| `{engine}` |")))
                .unwrap_or_else(|| panic!("no row for {engine}"));
            for format in engine.kind().formats() {
                assert!(row.contains(format.label), "{row}");
            }
            for path in engine.kind().api_paths() {
                assert!(row.contains(&format!("`{path}`")), "{row}");
            }
        }
    }
}
