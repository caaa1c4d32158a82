use magic_sync::codec::ProtoMapping;
use magic_sync::row::Row;

mod wire {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Unit {
        #[prost(int32, tag = "1")]
        pub id: i32,
        #[prost(string, tag = "2")]
        pub name: String,
    }
}

#[derive(magic_sync::Row)]
#[row(down, all, key(id), codec = protobuf(wire::Unit))]
struct Unit {
    id: i32,
    name: String,
}

impl ProtoMapping<wire::Unit> for Unit {
    fn to_proto(&self) -> wire::Unit {
        wire::Unit {
            id: self.id,
            name: self.name.clone(),
        }
    }
    fn from_proto(message: wire::Unit) -> Result<Self, String> {
        Ok(Unit {
            id: message.id,
            name: message.name,
        })
    }
}

fn main() {
    assert_eq!(Unit::codec().format(), "protobuf");
}
