// Not called yet outside its tests.
#[allow(dead_code)]
pub(crate) mod jvm_attach;
