#[derive(magic_sync::Row)]
#[row(down, key(id))]
#[row(group(
    members = "m",
    member = "promotion_id",
    grants = "g",
    replica = "unit_id",
    unit = "u"
))]
struct Promotion {
    id: i64,
}

fn main() {}
