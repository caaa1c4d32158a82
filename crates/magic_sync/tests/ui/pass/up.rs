use magic_sync::row::{Mirror, Row, Rule};

#[derive(magic_sync::Row)]
#[row(up, key(origin_id, number))]
struct Sale {
    #[row(origin)]
    origin_id: String,
    number: i64,
    #[row(version)]
    revision: i64,
    sold_at: chrono::DateTime<chrono::Utc>,
    lines: serde_json::Value,
}

/// An up table without a version column.
#[derive(magic_sync::Row)]
#[row(up, key(id), key_without_origin)]
struct Note {
    id: i64,
    #[row(origin)]
    writer: String,
}

fn main() {
    assert_eq!(Sale::TABLE.mirror, Mirror::Up);
    assert_eq!(Sale::TABLE.rule, Rule::Origin);
    assert_eq!(Note::TABLE.version, None);
}
