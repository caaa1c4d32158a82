#[derive(magic_sync::Row)]
#[row(down, all, key(id), key_without_origin)]
struct Price {
    id: i64,
}

fn main() {}
