#[derive(magic_sync::Row)]
#[row(down, all, key(id))]
enum Colour {
    Red,
    Green,
}

fn main() {}
