#[derive(magic_sync::Row)]
#[row(down, follows = "region, order_no", key(region, order_number, line))]
struct OrderLine {
    region: String,
    order_number: i64,
    line: i32,
}

fn main() {}
