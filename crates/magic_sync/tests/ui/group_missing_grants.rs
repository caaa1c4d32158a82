#[derive(magic_sync::Row)]
#[row(down, key(id))]
#[row(group(
    members = "promotion_members",
    member = "promotion_id",
    replica = "unit_id"
))]
struct Promotion {
    id: i64,
}

fn main() {}
