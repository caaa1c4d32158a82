//! Checks a declaration as a whole and turns it into the plain data `row` writes out.

use crate::attrs::{CodecAttr, Direction, FieldAttrs, GroupAttr, RuleAttr, StructAttrs};
use crate::errors::Errors;
use crate::shape::ColumnField;
use proc_macro2::Span;
use syn::{Error, Ident, LitStr, Result};

/// A field together with the roles its attributes give it.
pub struct Marked<'a> {
    pub column: ColumnField<'a>,
    pub roles: FieldAttrs,
}

pub enum CheckedRule {
    All,
    Replica(String),
    Partition(String),
    Referenced,
    Follows(Vec<String>),
    Group {
        members: String,
        member: Vec<String>,
        group: String,
        grants: String,
        replica: String,
    },
    Origin,
}

/// A declaration that passed every check.
pub struct Decl {
    pub table: String,
    pub schema: String,
    pub mirror: Direction,
    pub rule: CheckedRule,
    pub key: Vec<String>,
    pub owned: Vec<String>,
    pub version: Option<String>,
    pub origin: Option<String>,
    pub retired: Option<String>,
    pub lane: Option<String>,
    pub codec: CodecAttr,
}

/// What every check needs: the struct's name and its fields.
struct Ctx<'a, 'b> {
    owner: &'a Ident,
    fields: &'a [Marked<'b>],
}

impl Ctx<'_, '_> {
    fn has_field(&self, name: &str) -> bool {
        self.fields.iter().any(|f| f.column.name == name)
    }

    /// The one column `lit` names, required to be a field.
    fn column_of(&self, lit: &LitStr, attr: &str) -> Result<String> {
        let name = lit.value();
        match self.has_field(&name) {
            true => Ok(name),
            false => Err(self.no_such_field(lit, attr, &name)),
        }
    }

    /// Each column `lit` lists (comma separated), each required to be a field.
    fn columns_of(&self, lit: &LitStr, attr: &str) -> Result<Vec<String>> {
        let names = split_list(lit, attr)?;
        match names.iter().find(|n| !self.has_field(n)) {
            Some(missing) => Err(self.no_such_field(lit, attr, missing)),
            None => Ok(names),
        }
    }

    fn no_such_field(&self, lit: &LitStr, attr: &str, missing: &str) -> Error {
        let message = format!(
            "`{attr} = {:?}`: struct `{}` has no field `{missing}`; \
             the rule's columns must be fields of the struct",
            lit.value(),
            self.owner
        );
        Error::new(lit.span(), message)
    }
}

/// The comma-separated names in `lit`, trimmed, none empty.
fn split_list(lit: &LitStr, attr: &str) -> Result<Vec<String>> {
    let text = lit.value();
    let names: Vec<String> = text.split(',').map(|n| n.trim().to_string()).collect();
    if names.iter().any(String::is_empty) {
        let message =
            format!("`{attr} = {text:?}`: a column name is empty; write `\"a\"` or `\"a, b\"`");
        return Err(Error::new(lit.span(), message));
    }
    Ok(names)
}

pub fn declaration(attrs: StructAttrs, owner: &Ident, fields: &[Marked]) -> Result<Decl> {
    let ctx = Ctx { owner, fields };
    let mirror = direction(&attrs, owner)?;
    let mut errors = Errors::default();
    let key = errors.keep(key(&ctx, &attrs));
    let rule = errors.keep(rule(&ctx, &attrs, mirror, key.as_deref()));
    let owned = errors.keep(owned(&ctx, mirror, key.as_deref().unwrap_or_default()));
    let version = errors.keep(only_up(&ctx, mirror, "version", |r| r.version));
    let origin = errors.keep(origin(&ctx, &attrs, mirror, key.as_deref()));
    let retired = errors.keep(retired(&ctx, &attrs, mirror));
    let lane = errors.keep(lane(&ctx, &attrs, mirror, owned.as_deref()));
    let (
        Some(key),
        Some(rule),
        Some(owned),
        Some(version),
        Some(origin),
        Some(retired),
        Some(lane),
    ) = (key, rule, owned, version, origin, retired, lane)
    else {
        return Err(errors.into_error());
    };
    errors.keep(owned_beside_rule(&ctx, mirror, &rule, &owned));
    errors.check()?;
    Ok(Decl {
        table: attrs
            .table
            .map_or_else(|| snake_case(&owner.to_string()), |t| t.value()),
        schema: attrs
            .schema
            .map_or_else(|| "public".to_string(), |s| s.value()),
        mirror,
        rule,
        key,
        owned,
        version,
        origin,
        retired,
        lane,
        codec: attrs.codec.unwrap_or(CodecAttr::Json),
    })
}

fn direction(attrs: &StructAttrs, owner: &Ident) -> Result<Direction> {
    match &attrs.direction {
        Some(d) => Ok(d.value),
        None => Err(Error::new(
            owner.span(),
            format!(
                "struct `{owner}` has no direction: add `#[row(down)]`, `#[row(up)]` or `#[row(both)]`"
            ),
        )),
    }
}

fn key(ctx: &Ctx, attrs: &StructAttrs) -> Result<Vec<String>> {
    let owner = ctx.owner;
    let Some(key) = &attrs.key else {
        let message = format!("struct `{owner}` has no key: add `#[row(key(...))]` naming its key fields, e.g. `#[row(key(id))]`");
        return Err(Error::new(owner.span(), message));
    };
    let mut names: Vec<String> = Vec::with_capacity(key.value.len());
    for ident in &key.value {
        let name = syn::ext::IdentExt::unraw(ident).to_string();
        if !ctx.has_field(&name) {
            let message = format!("`key({name})`: struct `{owner}` has no field `{name}`");
            return Err(Error::new(ident.span(), message));
        }
        if names.contains(&name) {
            let message = format!("`key(...)` of struct `{owner}` names field `{name}` twice");
            return Err(Error::new(ident.span(), message));
        }
        names.push(name);
    }
    Ok(names)
}

fn rule(
    ctx: &Ctx,
    attrs: &StructAttrs,
    mirror: Direction,
    key: Option<&[String]>,
) -> Result<CheckedRule> {
    let owner = ctx.owner;
    match (&attrs.rule, mirror) {
        (Some(rule), Direction::Up) => Err(Error::new(
            rule.span,
            format!(
                "`#[row({})]`: `{owner}` is an `up` table, and up tables take no rule \
                 (a record stays with the replica that wrote it); remove it",
                rule.value.word()
            ),
        )),
        (None, Direction::Up) => Ok(CheckedRule::Origin),
        (None, _) => Err(Error::new(
            owner.span(),
            format!(
                "`{}` table `{owner}` has no rule: add one of `all`, `replica = \"column\"`, \
                 `partition = \"column\"`, `referenced`, `follows = \"column\"`, `group(...)`",
                mirror.word()
            ),
        )),
        (Some(rule), _) => down_rule(ctx, &rule.value, key),
    }
}

fn down_rule(ctx: &Ctx, rule: &RuleAttr, key: Option<&[String]>) -> Result<CheckedRule> {
    Ok(match rule {
        RuleAttr::All => CheckedRule::All,
        RuleAttr::Referenced => CheckedRule::Referenced,
        RuleAttr::Replica(lit) => CheckedRule::Replica(ctx.column_of(lit, "replica")?),
        RuleAttr::Partition(lit) => CheckedRule::Partition(ctx.column_of(lit, "partition")?),
        RuleAttr::Follows(lit) => CheckedRule::Follows(ctx.columns_of(lit, "follows")?),
        RuleAttr::Group(group) => group_rule(ctx, group, key)?,
    })
}

/// The `member` columns live in the members table and point at this table's
/// key, so there is one per key column.
fn group_rule(ctx: &Ctx, group: &GroupAttr, key: Option<&[String]>) -> Result<CheckedRule> {
    let member = split_list(&group.member, "member")?;
    if let Some(key) = key.filter(|k| k.len() != member.len()) {
        let message = format!(
            "`group(member = {:?})` names {} column(s), but the key of struct `{}` has {} ({}); \
             list one members-table column per key column, in key order",
            group.member.value(),
            member.len(),
            ctx.owner,
            key.len(),
            key.join(", ")
        );
        return Err(Error::new(group.member.span(), message));
    }
    Ok(CheckedRule::Group {
        members: group.members.value(),
        member,
        group: group
            .group
            .as_ref()
            .map_or_else(|| "group_id".to_string(), LitStr::value),
        grants: group.grants.value(),
        replica: group.replica.value(),
    })
}

fn owned(ctx: &Ctx, mirror: Direction, key: &[String]) -> Result<Vec<String>> {
    let mut errors = Errors::default();
    let mut owned = Vec::new();
    for field in ctx.fields {
        let Some(span) = field.roles.owned else {
            continue;
        };
        let name = &field.column.name;
        if mirror != Direction::Both {
            errors.push(owned_error(span, name, ctx.owner, mirror));
        } else if key.contains(name) {
            let message = format!(
                "`#[row(owned)]` on field `{name}`: `{name}` is a key column of `{}`, \
                 and a replica never owns its key",
                ctx.owner
            );
            errors.push(Error::new(span, message));
        } else {
            owned.push(name.clone());
        }
    }
    errors.check().map(|()| owned)
}

/// A replica may not own what decides which replicas hold a row (it could
/// move a row to replicas whose rules do not give it them), and a `both`
/// table must give the replica something to write: with no owned column it
/// is a `down` table whose uploads could never be filed.
fn owned_beside_rule(
    ctx: &Ctx,
    mirror: Direction,
    rule: &CheckedRule,
    owned: &[String],
) -> Result<()> {
    if mirror != Direction::Both {
        return Ok(());
    }
    if owned.is_empty() {
        let message = format!(
            "`both` table `{}` has no `#[row(owned)]` column: mark the columns the replica \
             writes `#[row(owned)]`, or declare the table `down`",
            ctx.owner
        );
        return Err(Error::new(ctx.owner.span(), message));
    }
    let (attr, decides): (&str, Vec<&String>) = match rule {
        CheckedRule::Replica(c) => ("replica", vec![c]),
        CheckedRule::Partition(c) => ("partition", vec![c]),
        CheckedRule::Follows(cs) => ("follows", cs.iter().collect()),
        _ => return Ok(()),
    };
    let mut errors = Errors::default();
    for field in ctx.fields {
        let (Some(span), name) = (field.roles.owned, &field.column.name) else {
            continue;
        };
        if decides.contains(&name) {
            let message = format!(
                "`#[row(owned)]` on field `{name}`: `{name}` is the `{attr}` column of `{}`, \
                 which decides which replicas hold a row, and a replica never owns it",
                ctx.owner
            );
            errors.push(Error::new(span, message));
        }
    }
    errors.check()
}

fn owned_error(span: Span, name: &str, owner: &Ident, mirror: Direction) -> Error {
    let message = format!(
        "`#[row(owned)]` on field `{name}`: owned columns are for `both` tables, \
         and `{owner}` is `{}`",
        mirror.word()
    );
    Error::new(span, message)
}

/// The one field marked `attr`, which only `up` tables take.
fn only_up(
    ctx: &Ctx,
    mirror: Direction,
    attr: &str,
    role: fn(&FieldAttrs) -> Option<Span>,
) -> Result<Option<String>> {
    let mut errors = Errors::default();
    let mut found: Option<&str> = None;
    for field in ctx.fields {
        let Some(span) = role(&field.roles) else {
            continue;
        };
        let name = field.column.name.as_str();
        if mirror != Direction::Up {
            let message = format!(
                "`#[row({attr})]` on field `{name}`: {attr} columns are for `up` tables, \
                 and `{}` is `{}`",
                ctx.owner,
                mirror.word()
            );
            errors.push(Error::new(span, message));
        } else if let Some(first) = found {
            let message = format!(
                "`#[row({attr})]` on field `{name}`: struct `{}` already has a {attr} field, `{first}`; \
                 a table has at most one",
                ctx.owner
            );
            errors.push(Error::new(span, message));
        } else {
            found = Some(name);
        }
    }
    errors.check().map(|()| found.map(str::to_string))
}

fn origin(
    ctx: &Ctx,
    attrs: &StructAttrs,
    mirror: Direction,
    key: Option<&[String]>,
) -> Result<Option<String>> {
    let origin = only_up(ctx, mirror, "origin", |r| r.origin)?;
    if let (Some(span), false) = (attrs.key_without_origin, mirror == Direction::Up) {
        let message = format!(
            "`#[row(key_without_origin)]`: `{}` is not an `up` table; only records have an origin",
            ctx.owner
        );
        return Err(Error::new(span, message));
    }
    if mirror != Direction::Up {
        return Ok(origin);
    }
    let Some(column) = &origin else {
        let message = format!(
            "`up` table `{}` has no origin field: mark the field naming the replica \
             that wrote the record with `#[row(origin)]`",
            ctx.owner
        );
        return Err(Error::new(ctx.owner.span(), message));
    };
    let key = key.unwrap_or_default();
    if !key.is_empty() && !key.contains(column) && attrs.key_without_origin.is_none() {
        let message = format!(
            "`up` table `{owner}`: its key ({keys}) leaves out its origin `{column}`, so a \
             record one replica files first under a key is that replica's, and another's \
             under the same key is refused. Put the origin in the key \
             (`key({column}, {keys})`), or, when keys are drawn so that replicas never share \
             one (random ids), say so with `#[row(key_without_origin)]`",
            owner = ctx.owner,
            keys = key.join(", "),
        );
        return Err(Error::new(ctx.owner.span(), message));
    }
    Ok(origin)
}

/// The upload lane of a table the replica writes: `up`, or `both` with
/// owned columns. A name, not empty (the unnamed first lane is the default).
fn lane(
    ctx: &Ctx,
    attrs: &StructAttrs,
    mirror: Direction,
    owned: Option<&[String]>,
) -> Result<Option<String>> {
    let Some(lit) = &attrs.lane else {
        return Ok(None);
    };
    let name = lit.value();
    let owner = ctx.owner;
    let written = match mirror {
        Direction::Up => true,
        Direction::Both => owned.is_some_and(|o| !o.is_empty()),
        Direction::Down => false,
    };
    if !written {
        let message = format!(
            "`lane = {name:?}`: `{owner}` is not written by replicas; a lane carries what a \
             replica writes (`up` tables, and `both` tables with `owned` columns)"
        );
        return Err(Error::new(lit.span(), message));
    }
    if name.trim().is_empty() {
        return Err(Error::new(
            lit.span(),
            "`lane = \"\"`: a lane needs a name (tables without one share the first lane)",
        ));
    }
    Ok(Some(name))
}

fn retired(ctx: &Ctx, attrs: &StructAttrs, mirror: Direction) -> Result<Option<String>> {
    let Some(lit) = &attrs.retired else {
        return Ok(None);
    };
    let name = lit.value();
    let owner = ctx.owner;
    if mirror == Direction::Up {
        let message = format!(
            "`retired = {name:?}`: `{owner}` is an `up` table; only tables that go down \
             (`down`, `both`) have a retired column"
        );
        return Err(Error::new(lit.span(), message));
    }
    if ctx.has_field(&name) {
        let message = format!(
            "`retired = {name:?}`: `{name}` is a field of struct `{owner}`; the retired column \
             is the replica's own, kept beside the declared columns, so name a column that is not a field"
        );
        return Err(Error::new(lit.span(), message));
    }
    if name.trim().is_empty() {
        return Err(Error::new(
            lit.span(),
            "`retired = \"\"`: the retired column needs a name",
        ));
    }
    Ok(Some(name))
}

/// `OrderLine` → `order_line`, `HTTPRequest` → `http_request`.
pub fn snake_case(name: &str) -> String {
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::with_capacity(name.len() + 4);
    for (i, &c) in chars.iter().enumerate() {
        if c.is_uppercase() && i > 0 && starts_word(&chars, i) {
            out.push('_');
        }
        out.extend(c.to_lowercase());
    }
    out
}

/// Whether the uppercase letter at `i` begins a new word.
fn starts_word(chars: &[char], i: usize) -> bool {
    let prev = chars[i - 1];
    let next_lower = chars.get(i + 1).is_some_and(|c| c.is_lowercase());
    prev.is_lowercase() || prev.is_ascii_digit() || (prev.is_uppercase() && next_lower)
}
