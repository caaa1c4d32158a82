use magic_sync::row::{GroupRule, Row, Rule};

#[derive(magic_sync::Row)]
#[row(down, key(region, number))]
#[row(group(
    members = "promotion_members",
    member = "promotion_region, promotion_number",
    group = "promotion_group",
    grants = "unit_groups",
    replica = "unit_id"
))]
struct Promotion {
    region: String,
    number: i64,
}

fn main() {
    let expected = Rule::Group(GroupRule {
        members: "promotion_members",
        member: &["promotion_region", "promotion_number"],
        group: "promotion_group",
        grants: "unit_groups",
        replica: "unit_id",
    });
    assert_eq!(Promotion::TABLE.rule, expected);
}
