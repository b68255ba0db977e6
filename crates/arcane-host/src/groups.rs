//! `[[group]]` tables in `arcane.toml`: models of which at most one is loaded at a
//! time (llama-swap's `swap: true` groups).
//!
//! ```toml
//! [[group]]
//! id = "chat"
//! members = ["coder", "writer"]
//! exclusive = true
//! ```
//!
//! Every group must say `exclusive = true`. `exclusive = false` (or no `exclusive`) is
//! refused rather than read as a grouping with no effect: models already run together
//! unless a device limit says otherwise, so such a table would change nothing while
//! looking, to someone coming from llama-swap, as if `swap: false` or `persistent`
//! semantics came with it. Refusing it keeps every key in the file meaningful and
//! leaves the spelling free for a later meaning.
//!
//! A member is a model id (not an alias), in at most one group; a group has at least
//! one member. A member with `pin = true` is refused: the group unloads its members to
//! swap them, which a pin forbids (`keep_alive = -1` and `load = "on-start"` only imply
//! a pin, and a group's swap comes first for them).

use arcane_gateway::Group;
use arcane_report::codes;
use serde_json::{json, Value};

use crate::error::{Error, Refusal};
use crate::models::{GroupTable, ModelTable};

/// Why a `[[group]]` table is refused (all `ARCANE_USAGE`, naming the values).
#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    /// The id is empty or uses other characters than model ids may.
    #[error("the group id `{0}` may use only letters, digits, `.`, `-` and `_`")]
    BadId(String),
    /// Two groups have one id.
    #[error("the group id `{0}` is used twice in `[[group]]`")]
    DuplicateId(String),
    /// `exclusive` is missing or `false`.
    #[error("group `{group}` needs `exclusive = true`{}: a group only keeps its members from running together; without it, remove the table (models run together unless a device limit says otherwise)", given.map(|g| format!(", not `exclusive = {g}`")).unwrap_or_default())]
    NotExclusive {
        /// The group.
        group: String,
        /// What it said.
        given: Option<bool>,
    },
    /// `members` is empty.
    #[error("group `{0}` has no `members`")]
    Empty(String),
    /// A member names no `[[model]]` id.
    #[error("group `{group}` names `{member}`, which is not the id of a `[[model]]`")]
    UnknownMember {
        /// The group.
        group: String,
        /// The member.
        member: String,
        /// The model ids.
        known: Vec<String>,
    },
    /// A model is a member of two groups (or listed twice in one).
    #[error("model `{member}` is in group `{first}` and in group `{second}`; a model belongs to at most one group")]
    TwoGroups {
        /// The model.
        member: String,
        /// The first group naming it.
        first: String,
        /// The second.
        second: String,
    },
    /// A member says `pin = true`, which a swap would break.
    #[error("model `{member}` of group `{group}` has `pin = true`, but the group unloads its members to swap them; remove the pin or the membership")]
    PinnedMember {
        /// The group.
        group: String,
        /// The member.
        member: String,
    },
}

impl GroupError {
    /// The stable code: the configuration is invalid.
    pub fn code(&self) -> &'static str {
        codes::ARCANE_USAGE
    }

    /// The offending values.
    pub fn details(&self) -> Value {
        match self {
            Self::BadId(id) | Self::DuplicateId(id) | Self::Empty(id) => json!({"group": id}),
            Self::NotExclusive { group, given } => json!({"group": group, "exclusive": given}),
            Self::UnknownMember {
                group,
                member,
                known,
            } => json!({"group": group, "member": member, "known": known}),
            Self::TwoGroups {
                member,
                first,
                second,
            } => json!({"member": member, "groups": [first, second]}),
            Self::PinnedMember { group, member } => json!({"group": group, "member": member}),
        }
    }
}

impl From<GroupError> for Error {
    fn from(error: GroupError) -> Self {
        Refusal::new(error.code(), error.to_string(), error.details()).into()
    }
}

/// The exclusive groups of `tables`, checked against the `[[model]]` tables `models`.
pub fn groups(tables: &[GroupTable], models: &[ModelTable]) -> Result<Vec<Group>, GroupError> {
    let mut groups: Vec<Group> = Vec::new();
    for table in tables {
        check_table(table, &groups)?;
        for member in &table.members {
            check_member(table, member, models, &groups)?;
        }
        groups.push(Group {
            id: table.id.clone(),
            members: table.members.clone(),
        });
    }
    Ok(groups)
}

/// The group's own keys: a well-formed unique id, `exclusive = true`, members.
fn check_table(table: &GroupTable, earlier: &[Group]) -> Result<(), GroupError> {
    if !crate::models::is_name(&table.id) {
        return Err(GroupError::BadId(table.id.clone()));
    }
    if earlier.iter().any(|g| g.id == table.id) {
        return Err(GroupError::DuplicateId(table.id.clone()));
    }
    if table.exclusive != Some(true) {
        return Err(GroupError::NotExclusive {
            group: table.id.clone(),
            given: table.exclusive,
        });
    }
    if table.members.is_empty() {
        return Err(GroupError::Empty(table.id.clone()));
    }
    Ok(())
}

/// One member: a model id, not pinned, in no other group (nor twice in this one).
fn check_member(
    table: &GroupTable,
    member: &str,
    models: &[ModelTable],
    earlier: &[Group],
) -> Result<(), GroupError> {
    let Some(model) = models.iter().find(|m| m.id == member) else {
        return Err(GroupError::UnknownMember {
            group: table.id.clone(),
            member: member.into(),
            known: models.iter().map(|m| m.id.clone()).collect(),
        });
    };
    let twice_here = table.members.iter().filter(|m| *m == member).count() > 1;
    let elsewhere = earlier
        .iter()
        .find(|g| g.members.iter().any(|m| m == member))
        .map(|g| g.id.clone());
    if let Some(first) = elsewhere.or_else(|| twice_here.then(|| table.id.clone())) {
        return Err(GroupError::TwoGroups {
            member: member.into(),
            first,
            second: table.id.clone(),
        });
    }
    if model.pin == Some(true) {
        return Err(GroupError::PinnedMember {
            group: table.id.clone(),
            member: member.into(),
        });
    }
    Ok(())
}
