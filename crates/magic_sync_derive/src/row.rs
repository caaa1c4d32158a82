//! `#[derive(Row)]`: parse, check, then write the `Columns` and `Row` impls.

use crate::attrs::{self, CodecAttr, Direction};
use crate::check::{self, CheckedRule, Decl, Marked};
use crate::columns::impl_columns;
use crate::errors::Errors;
use crate::shape::named_fields;
use proc_macro2::TokenStream;
use quote::quote;
use syn::{DeriveInput, Ident, Result};

pub fn expand(input: &DeriveInput) -> Result<TokenStream> {
    let owner = &input.ident;
    let fields = named_fields(input, "Row")?;
    let struct_attrs = attrs::parse_struct(&input.attrs, owner);
    let mut errors = Errors::default();
    let mut marked = Vec::with_capacity(fields.len());
    for column in fields {
        if let Some(roles) = errors.keep(attrs::parse_field(&column.field.attrs, &column.name)) {
            marked.push(Marked { column, roles });
        }
    }
    let struct_attrs = errors.keep(struct_attrs);
    let Some(struct_attrs) = struct_attrs else {
        return Err(errors.into_error());
    };
    errors.check()?;
    let decl = check::declaration(struct_attrs, owner, &marked)?;
    let columns: Vec<_> = marked.into_iter().map(|m| m.column).collect();
    let columns_impl = impl_columns(owner, &columns);
    let row_impl = impl_row(owner, &decl);
    Ok(quote! { #columns_impl #row_impl })
}

fn impl_row(owner: &Ident, decl: &Decl) -> TokenStream {
    let table = table(owner, decl);
    let codec = codec(&decl.codec);
    quote! {
        #[automatically_derived]
        impl ::magic_sync::row::Row for #owner {
            const TABLE: ::magic_sync::row::Table = #table;

            fn codec() -> ::magic_sync::codec::Codec<Self> {
                #codec
            }

            fn __sealed() -> ::magic_sync::row::sealed::DeriveOnly {
                ::magic_sync::row::sealed::DeriveOnly::__magic_sync_derive_only()
            }
        }
    }
}

fn table(owner: &Ident, decl: &Decl) -> TokenStream {
    let Decl {
        table,
        schema,
        key,
        owned,
        ..
    } = decl;
    let rust_type = owner.to_string();
    let mirror = mirror(decl.mirror);
    let rule = rule(&decl.rule);
    let version = option(decl.version.as_deref());
    let origin = option(decl.origin.as_deref());
    let retired = option(decl.retired.as_deref());
    let lane = option(decl.lane.as_deref());
    quote! {
        ::magic_sync::row::Table {
            name: #table,
            schema: #schema,
            rust_type: #rust_type,
            mirror: #mirror,
            rule: #rule,
            columns: <Self as ::magic_sync::row::Columns>::COLUMNS,
            key: &[#(#key),*],
            owned: &[#(#owned),*],
            version: #version,
            origin: #origin,
            retired: #retired,
            lane: #lane,
        }
    }
}

fn mirror(direction: Direction) -> TokenStream {
    match direction {
        Direction::Down => quote!(::magic_sync::row::Mirror::Down),
        Direction::Up => quote!(::magic_sync::row::Mirror::Up),
        Direction::Both => quote!(::magic_sync::row::Mirror::Both),
    }
}

fn rule(rule: &CheckedRule) -> TokenStream {
    match rule {
        CheckedRule::All => quote!(::magic_sync::row::Rule::All),
        CheckedRule::Referenced => quote!(::magic_sync::row::Rule::Referenced),
        CheckedRule::Origin => quote!(::magic_sync::row::Rule::Origin),
        CheckedRule::Replica(c) => quote!(::magic_sync::row::Rule::Replica(#c)),
        CheckedRule::Partition(c) => quote!(::magic_sync::row::Rule::Partition(#c)),
        CheckedRule::Follows(cs) => quote!(::magic_sync::row::Rule::Follows(&[#(#cs),*])),
        CheckedRule::Group {
            members,
            member,
            group,
            grants,
            replica,
        } => quote! {
            ::magic_sync::row::Rule::Group(::magic_sync::row::GroupRule {
                members: #members,
                member: &[#(#member),*],
                group: #group,
                grants: #grants,
                replica: #replica,
            })
        },
    }
}

fn option(value: Option<&str>) -> TokenStream {
    match value {
        Some(v) => quote!(::std::option::Option::Some(#v)),
        None => quote!(::std::option::Option::None),
    }
}

fn codec(codec: &CodecAttr) -> TokenStream {
    match codec {
        CodecAttr::Json => quote!(::magic_sync::codec::Codec::json()),
        CodecAttr::Protobuf(message) => quote!(::magic_sync::codec::Codec::protobuf::<#message>()),
    }
}
