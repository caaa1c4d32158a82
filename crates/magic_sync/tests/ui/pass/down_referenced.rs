use magic_sync::row::{Row, Rule};

#[derive(magic_sync::Row)]
#[row(down, referenced, key(r#type))]
struct Category {
    r#type: String,
}

fn main() {
    assert_eq!(Category::TABLE.rule, Rule::Referenced);
    assert_eq!(Category::TABLE.key, &["type"]);
}
