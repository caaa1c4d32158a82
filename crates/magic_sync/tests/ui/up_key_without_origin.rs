#[derive(magic_sync::Row)]
#[row(up, key(number))]
struct Sale {
    number: i64,
    #[row(origin)]
    till: String,
}

fn main() {}
