#[derive(magic_sync::Row)]
#[row(down, key(region, number))]
#[row(group(
    members = "promotion_members",
    member = "promotion_id",
    grants = "unit_groups",
    replica = "unit_id"
))]
struct Promotion {
    region: String,
    number: i64,
}

fn main() {}
