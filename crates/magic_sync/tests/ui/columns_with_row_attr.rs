#[derive(magic_sync::Columns)]
#[row(down)]
struct Totals {
    count: i64,
}

fn main() {}
