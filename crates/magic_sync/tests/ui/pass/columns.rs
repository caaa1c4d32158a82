use magic_sync::row::Columns;

#[derive(magic_sync::Columns)]
struct Totals {
    count: i64,
    sum: Option<f64>,
}

fn main() {
    assert_eq!(Totals::COLUMNS.len(), 2);
}
