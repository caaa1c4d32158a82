#[derive(magic_sync::Row)]
#[row(up, key(id))]
struct Sale {
    id: i64,
    replica_id: String,
}

fn main() {}
