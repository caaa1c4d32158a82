//! The reads as tables for people. What the database holds may come from
//! a replica (an id, a table name, a reason quoting a row), so every text
//! is printed plain: a control character is written as its escape
//! (`\u{1b}`), and nothing read can move the operator's terminal.

use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use magic_sync::ops::{
    Action, Concern, Health, Listing, Overview, Progress, ReplicaSummary, RowProgress,
};
use std::borrow::Cow;
use std::fmt::Write as _;

/// `text` with each control character written as its escape.
pub fn plain(text: &str) -> Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return Cow::Borrowed(text);
    }
    Cow::Owned(
        text.chars()
            .map(|c| {
                if c.is_control() {
                    c.escape_unicode().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect(),
    )
}

/// Adds `cells` to `t`, each plain.
fn add(t: &mut Table, cells: Vec<String>) {
    t.add_row(
        cells
            .iter()
            .map(|c| plain(c).into_owned())
            .collect::<Vec<_>>(),
    );
}

fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED)
        .set_header(header.to_vec());
    t
}

fn or_dash<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "-".into(), |v| v.to_string())
}

fn replicas(list: &[ReplicaSummary]) -> Table {
    let mut t = table(&[
        "replica",
        "partition",
        "state",
        "acknowledged / last",
        "outbox",
        "rows on their way",
        "outdated",
        "refused",
        "last error",
    ]);
    for r in list {
        add(
            &mut t,
            vec![
                r.id.clone(),
                or_dash(r.partition.as_deref()),
                r.state.name().to_string(),
                format!("{} / {}", r.acknowledged, r.last_message),
                r.outbox.to_string(),
                r.rows_on_their_way.to_string(),
                r.rows_outdated.to_string(),
                r.rows_refused.to_string(),
                or_dash(r.last_error.as_deref()),
            ],
        );
    }
    t
}

pub fn overview(o: &Overview) -> String {
    let s = &o.states;
    let mut out = format!(
        "{} live replicas at {}: {} caught up, {} on their way, {} provisioning, \
         {} out of reach, {} waiting on a fix; {} notes pending\n",
        o.replicas,
        o.now.to_rfc3339(),
        s.caught_up,
        s.on_its_way,
        s.provisioning,
        s.out_of_reach,
        s.waiting_on_fix,
        o.pending_notes
    );
    if !o.worst.is_empty() {
        let _ = writeln!(out, "\nWorst first:\n{}", replicas(&o.worst));
    }
    if !o.tables.is_empty() {
        let mut t = table(&[
            "table",
            "replicas",
            "rows on their way",
            "outdated",
            "refused",
        ]);
        for f in &o.tables {
            add(
                &mut t,
                vec![
                    f.table.clone(),
                    f.replicas.to_string(),
                    f.rows_on_their_way.to_string(),
                    f.rows_outdated.to_string(),
                    f.rows_refused.to_string(),
                ],
            );
        }
        let _ = writeln!(out, "\nTables not where they should be yet:\n{t}");
    }
    if o.deployment.iter().any(|d| !d.done) {
        let _ = writeln!(
            out,
            "\nA deployment is under way:\n{}",
            deployment(&o.deployment)
        );
    }
    out
}

/// The last deployment, table by table.
pub fn deployment(d: &[magic_sync::deploy::Progress]) -> String {
    if d.is_empty() {
        return "no deployment: the declarations are those the sync began with\n".into();
    }
    let mut t = table(&["table", "work", "why", "rows worked through", "state"]);
    for p in d {
        add(
            &mut t,
            vec![
                p.table.clone(),
                p.work.clone(),
                p.why.clone(),
                format!("{} of about {}", p.rows_done, p.rows_total),
                if p.done { "done" } else { "under way" }.to_string(),
            ],
        );
    }
    format!("{t}\n")
}

/// The indexes the relay needs and the database lacks, as statements to
/// run, each under what the relay looks up through it.
pub fn indexes(missing: &[crate::Missing]) -> String {
    if missing.is_empty() {
        return "every index the relay needs is in place\n".into();
    }
    let mut out = format!(
        "the relay refuses to start until {} {} made:\n",
        missing.len(),
        if missing.len() == 1 {
            "index is"
        } else {
            "indexes are"
        }
    );
    for m in missing {
        let _ = write!(out, "\n-- {}\n{}\n", m.why, m.sql);
    }
    out
}

/// What starting a build would change: its dry run.
pub fn dry_run(d: &magic_sync::deploy::Deployment) -> String {
    d.to_string()
}

pub fn listing(l: &Listing) -> String {
    let mut out = format!("{}\n", replicas(&l.replicas));
    if let Some(next) = &l.next {
        let _ = writeln!(out, "more: --after {}", plain(next));
    }
    out
}

pub fn progress(p: &Progress) -> String {
    let r = &p.replica;
    let mut out = format!(
        "replica {} ({}) at {}: acknowledged {} of {}, {} in its outbox\n",
        plain(&r.id),
        r.state.name(),
        p.now.to_rfc3339(),
        r.acknowledged,
        r.last_message,
        r.outbox
    );
    if let Some(e) = &r.last_error {
        let _ = writeln!(out, "last send failed: {}", plain(e));
    }
    if !r.cohorts.is_empty() {
        let names: Vec<String> = r.cohorts.iter().map(|c| plain(c).into_owned()).collect();
        let _ = writeln!(
            out,
            "member of the cohort(s) {}: their rows are recorded once for every member",
            names.join(", ")
        );
    }
    let mut t = table(&[
        "table",
        "holds of should",
        "outdated",
        "on its way",
        "set aside",
        "up: unsent",
        "up: unfiled",
    ]);
    for row in &p.tables {
        let (done, of) = row.bar();
        add(
            &mut t,
            vec![
                row.table.clone(),
                format!("{done} of {of}"),
                row.outdated.to_string(),
                row.on_its_way.to_string(),
                row.set_aside.to_string(),
                or_dash(row.up.map(|u| u.unsent)),
                or_dash(row.up.map(|u| u.unfiled)),
            ],
        );
    }
    let _ = writeln!(out, "{t}");
    out
}

pub fn row(r: &RowProgress) -> String {
    let mut out = format!(
        "{} {} at {}; newest pending note: {}{}\n",
        plain(&r.table),
        plain(&r.key),
        r.now.to_rfc3339(),
        or_dash(r.pending_note),
        r.quarantined.as_ref().map_or(String::new(), |why| format!(
            "; cannot go down: {}",
            plain(why)
        ))
    );
    let mut t = table(&["replica", "state", "version", "message", "refused"]);
    for p in &r.replicas {
        add(
            &mut t,
            vec![
                p.replica.clone(),
                p.state.words().to_string(),
                or_dash(p.version),
                or_dash(p.message),
                or_dash(p.refused.as_deref()),
            ],
        );
    }
    let _ = writeln!(out, "{t}");
    out
}

pub fn health(h: &Health) -> String {
    let verdict = if h.healthy {
        "healthy: nothing waits for a fix"
    } else {
        "something waits for a fix to be deployed"
    };
    let mut out = format!("{verdict} (at {})\n", h.now.to_rfc3339());
    if h.items.is_empty() {
        return out;
    }
    let mut t = table(&["do", "what"]);
    for item in &h.items {
        add(
            &mut t,
            vec![action(item.action).to_string(), describe(&item.concern)],
        );
    }
    let _ = writeln!(out, "{t}");
    out
}

/// What to do about an item, in plain words.
pub fn action(action: Action) -> &'static str {
    match action {
        Action::DeployFix => "deploy a fix",
        Action::Wait => "wait",
    }
}

/// An item in plain words (control characters escaped).
pub fn describe(c: &Concern) -> String {
    let said = words(c);
    plain(&said).into_owned()
}

fn words(c: &Concern) -> String {
    match c {
        Concern::NotesPending {
            notes,
            rows,
            oldest_at,
        } => format!(
            "{notes} notes pending about {rows} rows{}",
            oldest_at.map_or(String::new(), |t| format!(
                ", the oldest since {}",
                t.to_rfc3339()
            ))
        ),
        Concern::ChangesKept { replica, rows } => {
            format!("{rows} changes kept for {replica} while its snapshot streams")
        }
        Concern::Refused {
            table,
            reason,
            rows,
            replicas,
            since,
        } => format!(
            "{rows} rows of {table} from {replicas} replicas refused since {}: {reason}",
            since.to_rfc3339()
        ),
        Concern::Quarantined {
            table,
            key,
            reason,
            since,
            blocked,
        } => format!(
            "{table} {key} cannot go down, set aside since {} with {blocked} rows that point at it: {reason}",
            since.to_rfc3339()
        ),
        Concern::Parked {
            table,
            notes,
            reason,
            since,
        } => format!(
            "{notes} notes of {table} parked since {}, the changes they are about sent nowhere: {reason}",
            since.to_rfc3339()
        ),
        Concern::DigestDiffered {
            replica,
            said,
            at,
            times,
        } => format!(
            "{replica}'s digest differed from the record at {} ({times} times in all), so it was provisioned again: {said}",
            at.to_rfc3339()
        ),
        Concern::SendFailing {
            replica,
            error,
            outbox,
        } => format!("sends to {replica} fail ({outbox} messages wait): {error}"),
        Concern::OutboxDropped { replica, alarm, .. } => {
            format!("the outbox of {replica} was dropped: {alarm}")
        }
    }
}

/// `broker status`: a row per replica, then the reports waiting for the
/// server.
pub fn broker_status(read: &crate::BrokerStatus) -> String {
    let mut t = table(&[
        "replica",
        "waiting",
        "reads",
        "handed up to",
        "not acknowledged",
        "handed again",
        "yet to hand",
    ]);
    for r in &read.replicas {
        let s = &r.standing;
        let c = s.consumer.as_ref();
        add(
            &mut t,
            vec![
                r.replica.clone(),
                s.waiting
                    .map_or_else(|| "no stream".into(), |w| w.to_string()),
                if c.is_some_and(|c| c.asking > 0) {
                    "yes"
                } else {
                    "no"
                }
                .into(),
                or_dash(c.map(|c| c.handed_up_to)),
                or_dash(c.map(|c| c.not_acknowledged)),
                or_dash(c.map(|c| c.handed_again)),
                or_dash(c.map(|c| c.yet_to_hand)),
            ],
        );
    }
    format!("{t}\nreports: {}\n", read.uploads)
}

#[cfg(test)]
mod tests {
    use super::*;
    use magic_sync::ops::{Item, PendingNotes};

    #[test]
    fn a_members_progress_names_its_cohort() {
        let now = chrono::DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        let replica = ReplicaSummary {
            id: "u1".into(),
            partition: None,
            state: magic_sync::ops::ReplicaState::CaughtUp,
            last_message: 7,
            acknowledged: 7,
            acknowledged_at: Some(now),
            outbox: 0,
            rows_on_their_way: 0,
            rows_outdated: 0,
            rows_refused: 0,
            changes_kept: 0,
            provisioning: false,
            snapshot_began_at: None,
            last_error: None,
            alarm: None,
            cohorts: vec!["all".into()],
        };
        let mut read = Progress {
            now,
            replica,
            tables: Vec::new(),
            backlog_at: None,
        };
        assert!(progress(&read).contains("member of the cohort(s) all:"));
        read.replica.cohorts.clear();
        assert!(!progress(&read).contains("cohort"));
    }

    #[test]
    fn nothing_read_reaches_the_terminal_as_a_control_character() {
        let since = chrono::DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        let refused = Concern::Refused {
            table: "sales".into(),
            reason: "PostgreSQL refused it: (Failing row contains (\u{1b}]0;owned\u{7}\u{1b}[2J))"
                .into(),
            rows: 1,
            replicas: 1,
            since,
        };
        let failing = Concern::SendFailing {
            replica: "t\u{9b}1".into(),
            error: "gone\r\nthe line after".into(),
            outbox: 2,
        };
        let read = Health {
            now: since,
            healthy: false,
            pending: PendingNotes::default(),
            items: [refused, failing]
                .into_iter()
                .map(|concern| Item {
                    action: concern.action(),
                    concern,
                })
                .collect(),
        };
        let printed = health(&read);
        assert!(
            !printed.chars().any(|c| c.is_control() && c != '\n'),
            "{printed:?}"
        );
        assert!(printed.contains("\\u{1b}]0;owned\\u{7}"), "{printed}");
        assert!(printed.contains("t\\u{9b}1"), "{printed}");
        for item in &read.items {
            assert!(!describe(&item.concern).chars().any(char::is_control));
        }
    }
}
