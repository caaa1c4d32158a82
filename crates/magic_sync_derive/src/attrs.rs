//! Parsing `#[row(...)]` attributes into plain data, keeping spans for errors.
//!
//! This module only checks each attribute on its own (known name, right value
//! shape, not given twice). How attributes fit together is `check`'s job.

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::meta::ParseNestedMeta;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned as _;
use syn::{Attribute, Error, Ident, LitStr, Path, Result, Token};

/// The struct-level attributes, for error messages.
pub const STRUCT_WORDS: &str = "table, schema, down, up, both, all, replica, partition, \
                                referenced, follows, group(...), key(...), codec, retired, lane, \
                                key_without_origin";
/// The field-level attributes, for error messages.
pub const FIELD_WORDS: &str = "owned, version, origin";

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Down,
    Up,
    Both,
}

impl Direction {
    pub fn word(self) -> &'static str {
        match self {
            Direction::Down => "down",
            Direction::Up => "up",
            Direction::Both => "both",
        }
    }
}

/// A value and where the attribute that gave it was written.
pub struct Spanned<T> {
    pub value: T,
    pub span: Span,
}

pub enum RuleAttr {
    All,
    Replica(LitStr),
    Partition(LitStr),
    Referenced,
    Follows(LitStr),
    Group(GroupAttr),
}

impl RuleAttr {
    pub fn word(&self) -> &'static str {
        match self {
            RuleAttr::All => "all",
            RuleAttr::Replica(_) => "replica",
            RuleAttr::Partition(_) => "partition",
            RuleAttr::Referenced => "referenced",
            RuleAttr::Follows(_) => "follows",
            RuleAttr::Group(_) => "group",
        }
    }
}

pub struct GroupAttr {
    pub members: LitStr,
    pub member: LitStr,
    pub group: Option<LitStr>,
    pub grants: LitStr,
    pub replica: LitStr,
}

pub enum CodecAttr {
    Json,
    Protobuf(Box<Path>),
}

/// Everything the struct's `#[row(...)]` attributes said.
#[derive(Default)]
pub struct StructAttrs {
    pub table: Option<LitStr>,
    pub schema: Option<LitStr>,
    pub direction: Option<Spanned<Direction>>,
    pub rule: Option<Spanned<RuleAttr>>,
    pub key: Option<Spanned<Vec<Ident>>>,
    pub codec: Option<CodecAttr>,
    pub retired: Option<LitStr>,
    pub lane: Option<LitStr>,
    /// An `up` table whose key leaves out its origin, on purpose.
    pub key_without_origin: Option<Span>,
}

/// Everything a field's `#[row(...)]` attributes said: where each role was given.
#[derive(Default)]
pub struct FieldAttrs {
    pub owned: Option<Span>,
    pub version: Option<Span>,
    pub origin: Option<Span>,
}

pub fn is_row(attr: &Attribute) -> bool {
    attr.path().is_ident("row")
}

/// The name written before `=` or `(`, as text (empty for a multi-segment path).
fn word(meta: &ParseNestedMeta) -> String {
    meta.path
        .get_ident()
        .map(|i| i.unraw().to_string())
        .unwrap_or_default()
}

/// Fills `slot`, or fails if an earlier attribute already did.
fn once<T>(slot: &mut Option<T>, value: T, meta: &ParseNestedMeta, owner: &str) -> Result<()> {
    if slot.is_some() {
        let message = format!("`{}` is given twice on {owner}; give it once", word(meta));
        return Err(meta.error(message));
    }
    *slot = Some(value);
    Ok(())
}

pub fn parse_struct(attrs: &[Attribute], owner: &Ident) -> Result<StructAttrs> {
    let mut out = StructAttrs::default();
    for attr in attrs.iter().filter(|a| is_row(a)) {
        attr.parse_nested_meta(|meta| out.item(&meta, owner))?;
    }
    Ok(out)
}

impl StructAttrs {
    fn item(&mut self, meta: &ParseNestedMeta, owner: &Ident) -> Result<()> {
        let on = format!("struct `{owner}`");
        match word(meta).as_str() {
            "table" => once(&mut self.table, meta.value()?.parse()?, meta, &on),
            "schema" => once(&mut self.schema, meta.value()?.parse()?, meta, &on),
            "retired" => once(&mut self.retired, meta.value()?.parse()?, meta, &on),
            "lane" => once(&mut self.lane, meta.value()?.parse()?, meta, &on),
            "key_without_origin" => once(&mut self.key_without_origin, meta.path.span(), meta, &on),
            "codec" => once(&mut self.codec, parse_codec(meta)?, meta, &on),
            "key" => once(&mut self.key, parse_key(meta, owner)?, meta, &on),
            "down" => self.set_direction(Direction::Down, meta, owner),
            "up" => self.set_direction(Direction::Up, meta, owner),
            "both" => self.set_direction(Direction::Both, meta, owner),
            "all" => self.set_rule(RuleAttr::All, meta, owner),
            "referenced" => self.set_rule(RuleAttr::Referenced, meta, owner),
            "replica" => self.set_rule(RuleAttr::Replica(meta.value()?.parse()?), meta, owner),
            "partition" => self.set_rule(RuleAttr::Partition(meta.value()?.parse()?), meta, owner),
            "follows" => self.set_rule(RuleAttr::Follows(meta.value()?.parse()?), meta, owner),
            "group" => self.set_rule(RuleAttr::Group(parse_group(meta, owner)?), meta, owner),
            _ => Err(unknown(meta, &on, STRUCT_WORDS)),
        }
    }

    fn set_direction(
        &mut self,
        value: Direction,
        meta: &ParseNestedMeta,
        owner: &Ident,
    ) -> Result<()> {
        if let Some(earlier) = &self.direction {
            let message = format!(
                "`#[row({})]`: struct `{owner}` already has direction `{}`; \
                 a table has exactly one of `down`, `up`, `both`",
                value.word(),
                earlier.value.word()
            );
            return Err(meta.error(message));
        }
        let span = meta.path.span();
        self.direction = Some(Spanned { value, span });
        Ok(())
    }

    fn set_rule(&mut self, value: RuleAttr, meta: &ParseNestedMeta, owner: &Ident) -> Result<()> {
        if let Some(earlier) = &self.rule {
            let message = format!(
                "`#[row({})]`: struct `{owner}` already has rule `{}`; a table has at most one rule",
                value.word(),
                earlier.value.word()
            );
            return Err(meta.error(message));
        }
        let span = meta.path.span();
        self.rule = Some(Spanned { value, span });
        Ok(())
    }
}

/// `name` as written, e.g. `colour` or `a::b`.
fn written(meta: &ParseNestedMeta) -> String {
    match meta.path.get_ident() {
        Some(ident) => ident.to_string(),
        None => quote::ToTokens::to_token_stream(&meta.path).to_string(),
    }
}

fn unknown(meta: &ParseNestedMeta, on: &str, known: &str) -> Error {
    let name = written(meta);
    meta.error(format!(
        "unknown attribute `#[row({name})]` on {on}; the attributes here are: {known}"
    ))
}

/// `key(a, b)`: field names, in key order.
fn parse_key(meta: &ParseNestedMeta, owner: &Ident) -> Result<Spanned<Vec<Ident>>> {
    let span = meta.path.span();
    let content;
    syn::parenthesized!(content in meta.input);
    let names = Punctuated::<Ident, Token![,]>::parse_terminated_with(&content, Ident::parse_any)?;
    if names.is_empty() {
        let message =
            format!("`key()` on struct `{owner}` names no field; write `key(id)` or `key(a, b)`");
        return Err(meta.error(message));
    }
    Ok(Spanned {
        value: names.into_iter().collect(),
        span,
    })
}

/// `codec = json` or `codec = protobuf(path::To::Message)`.
fn parse_codec(meta: &ParseNestedMeta) -> Result<CodecAttr> {
    let input = meta.value()?;
    let name: Ident = input.parse()?;
    if name == "json" {
        return Ok(CodecAttr::Json);
    }
    if name != "protobuf" {
        let message = format!(
            "unknown codec `{name}`; write `codec = json` or `codec = protobuf(path::To::Message)`"
        );
        return Err(Error::new(name.span(), message));
    }
    let content;
    syn::parenthesized!(content in input);
    Ok(CodecAttr::Protobuf(Box::new(content.parse()?)))
}

/// Slots of `group(...)`, filled as its items come.
#[derive(Default)]
struct GroupSlots {
    members: Option<LitStr>,
    member: Option<LitStr>,
    group: Option<LitStr>,
    grants: Option<LitStr>,
    replica: Option<LitStr>,
}

const GROUP_WORDS: &str = "members, member, group, grants, replica";

fn parse_group(meta: &ParseNestedMeta, owner: &Ident) -> Result<GroupAttr> {
    let on = format!("`group(...)` of struct `{owner}`");
    let group_span = meta.path.span();
    let mut slots = GroupSlots::default();
    meta.parse_nested_meta(|item| {
        let slot = match word(&item).as_str() {
            "members" => &mut slots.members,
            "member" => &mut slots.member,
            "group" => &mut slots.group,
            "grants" => &mut slots.grants,
            "replica" => &mut slots.replica,
            _ => {
                let message = format!(
                    "unknown item `{}` in {on}; the items of `group(...)` are: {GROUP_WORDS}",
                    written(&item)
                );
                return Err(item.error(message));
            }
        };
        once(slot, item.value()?.parse()?, &item, &on)
    })?;
    let missing = |what: &str, meaning: &str| {
        Error::new(
            group_span,
            format!("{on} is missing `{what} = \"...\"`: {meaning}"),
        )
    };
    Ok(GroupAttr {
        members: slots.members.ok_or_else(|| {
            missing(
                "members",
                "the table listing which rows belong to which group",
            )
        })?,
        member: slots.member.ok_or_else(|| {
            missing(
                "member",
                "the members table's column(s) pointing at this table's key",
            )
        })?,
        group: slots.group,
        grants: slots.grants.ok_or_else(|| {
            missing(
                "grants",
                "the table listing which group is given to which replica",
            )
        })?,
        replica: slots
            .replica
            .ok_or_else(|| missing("replica", "the grants table's column naming the replica"))?,
    })
}

/// The roles `#[row(...)]` gives one field.
pub fn parse_field(attrs: &[Attribute], column: &str) -> Result<FieldAttrs> {
    let on = format!("field `{column}`");
    let mut out = FieldAttrs::default();
    for attr in attrs.iter().filter(|a| is_row(a)) {
        attr.parse_nested_meta(|meta| {
            let slot = match word(&meta).as_str() {
                "owned" => &mut out.owned,
                "version" => &mut out.version,
                "origin" => &mut out.origin,
                _ => return Err(unknown(&meta, &on, FIELD_WORDS)),
            };
            once(slot, meta.path.span(), &meta, &on)
        })?;
    }
    Ok(out)
}
