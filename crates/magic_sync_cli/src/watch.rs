//! `magic-sync watch`: a bar per replica that is not caught up, its
//! messages acknowledged of those written, read again every interval,
//! until every replica is caught up and no note is pending (or Ctrl-C).
//!
//! The bars are drawn on the terminal (standard error) only; standard
//! output gets a line each time the number of replicas behind changes, and
//! one when it ends.

use crate::{Error, Outcome};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use magic_sync::ops::{self, ReplicaState, ReplicaSummary, Scope};
use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;
use tokio_postgres::Client;

/// Replicas per page when reading the whole scope.
const PAGE: usize = 500;

/// Watches `scope`, reading it every `every`.
pub async fn watch(
    client: &mut Client,
    scope: &Scope,
    every: Duration,
    out: &mut dyn Write,
) -> Result<Outcome, Error> {
    let board = MultiProgress::new();
    let mut bars: BTreeMap<String, ProgressBar> = BTreeMap::new();
    let mut tick = tokio::time::interval(every);
    let stop = tokio::signal::ctrl_c();
    tokio::pin!(stop);
    let mut waits_for_fix = false;
    let mut told = None;
    loop {
        tokio::select! {
            _ = &mut stop => {
                board.clear().map_err(Error::Output)?;
                writeln!(out, "stopped")?;
                return Ok(Outcome::of(waits_for_fix));
            }
            _ = tick.tick() => {}
        }
        let replicas = everyone(client, scope).await?;
        waits_for_fix = replicas
            .iter()
            .any(|r| r.state == ReplicaState::WaitingOnFix);
        let behind: Vec<&ReplicaSummary> = replicas
            .iter()
            .filter(|r| r.state != ReplicaState::CaughtUp)
            .collect();
        if behind.is_empty() {
            for bar in bars.values() {
                bar.finish_and_clear();
            }
            // Caught up is not settled while notes wait to be planned:
            // they may be on their way to any of them.
            let pending = ops::settled(client, scope).await?.pending_notes;
            if pending == 0 {
                writeln!(out, "all {} replicas caught up", replicas.len())?;
                return Ok(Outcome::Fine);
            }
            if told != Some(0) {
                told = Some(0);
                writeln!(
                    out,
                    "all {} replicas caught up; {pending} notes pending",
                    replicas.len()
                )?;
                out.flush()?;
            }
            continue;
        }
        // For a log or a pipe, where no bar is drawn: each change of how
        // many are behind.
        if told != Some(behind.len()) {
            told = Some(behind.len());
            let line = format!(
                "{} of {} replicas not caught up yet",
                behind.len(),
                replicas.len()
            );
            board.suspend(|| writeln!(out, "{line}").and_then(|()| out.flush()))?;
        }
        bars.retain(|id, bar| {
            let keep = behind.iter().any(|r| &r.id == id);
            if !keep {
                bar.finish_and_clear();
                board.remove(bar);
            }
            keep
        });
        for r in behind {
            let bar = bars
                .entry(r.id.clone())
                .or_insert_with(|| board.add(ProgressBar::new(0).with_style(style())));
            bar.set_length(r.last_message.max(0) as u64);
            bar.set_position(r.acknowledged.max(0) as u64);
            bar.set_prefix(crate::show::plain(&r.id).into_owned());
            bar.set_message(format!(
                "{}; {} rows on their way, {} outdated",
                r.state.name(),
                r.rows_on_their_way,
                r.rows_outdated
            ));
        }
    }
}

fn style() -> ProgressStyle {
    ProgressStyle::with_template("{prefix:>16} [{bar:30}] {pos}/{len} messages  {msg}")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}

/// Every live replica of `scope`, page after page.
async fn everyone(client: &mut Client, scope: &Scope) -> Result<Vec<ReplicaSummary>, Error> {
    let mut all = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = ops::listing(client, scope, after.as_deref(), PAGE).await?;
        all.extend(page.replicas);
        match page.next {
            Some(next) => after = Some(next),
            None => return Ok(all),
        }
    }
}
