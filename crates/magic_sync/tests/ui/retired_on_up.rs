#[derive(magic_sync::Row)]
#[row(up, key(id), key_without_origin, retired = "retired")]
struct Sale {
    id: i64,
    #[row(origin)]
    origin_id: String,
}

fn main() {}
