//! Typed attribute helpers: op builders read attributes through [`Attrs`] and never
//! touch protobuf fields. A missing required attribute or one of the wrong type is
//! an error naming the attribute.

use crate::proto::{AttributeProto, GraphProto, NodeProto};
use crate::tensor::read_tensor;
use dlrm_ir::Tensor;
use dlrm_ir::module::OnnxAttr;

/// The attributes of one node.
pub(crate) struct Attrs<'a> {
    node: &'a NodeProto,
}

impl<'a> Attrs<'a> {
    pub(crate) fn new(node: &'a NodeProto) -> Self {
        Attrs { node }
    }

    fn get(&self, name: &str) -> Option<&'a AttributeProto> {
        self.node
            .attribute
            .iter()
            .find(|a| a.name.as_deref() == Some(name))
    }

    /// True if the attribute is present.
    pub(crate) fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// An integer attribute, or `default`.
    pub(crate) fn int(&self, name: &str, default: i64) -> Result<i64, String> {
        match self.get(name) {
            None => Ok(default),
            Some(a) => {
                a.i.ok_or_else(|| format!("attribute `{name}` must be an integer"))
            }
        }
    }

    /// A float attribute, or `default`.
    pub(crate) fn float(&self, name: &str, default: f32) -> Result<f32, String> {
        match self.get(name) {
            None => Ok(default),
            Some(a) => {
                a.f.ok_or_else(|| format!("attribute `{name}` must be a float"))
            }
        }
    }

    /// A string attribute (UTF-8), or `default`.
    pub(crate) fn string(&self, name: &str, default: &str) -> Result<String, String> {
        match self.get(name) {
            None => Ok(default.to_string()),
            Some(a) => {
                a.s.as_deref()
                    .and_then(|b| std::str::from_utf8(b).ok())
                    .map(str::to_string)
                    .ok_or_else(|| format!("attribute `{name}` must be a string"))
            }
        }
    }

    /// An integer-list attribute, if present.
    pub(crate) fn ints(&self, name: &str) -> Option<Vec<i64>> {
        self.get(name).map(|a| a.ints.clone())
    }

    /// A tensor attribute (`Constant`'s `value`), if present.
    pub(crate) fn tensor(&self, name: &str) -> Result<Option<Tensor>, String> {
        match self.get(name) {
            None => Ok(None),
            Some(a) => match &a.t {
                Some(t) => read_tensor(t, None)
                    .map(Some)
                    .map_err(|e| format!("attribute `{name}`: {e}")),
                None => Err(format!("attribute `{name}` must be a tensor")),
            },
        }
    }

    /// A graph attribute (`Loop`'s `body`, `If`'s branches).
    pub(crate) fn graph(&self, name: &str) -> Result<&'a GraphProto, String> {
        self.get(name)
            .and_then(|a| a.g.as_ref())
            .ok_or_else(|| format!("missing graph attribute `{name}`"))
    }

    /// Every attribute as a module op's importer reads it
    /// ([`dlrm_ir::module::OnnxNode`]): the kinds it has a value for, the others
    /// [`OnnxAttr::Other`].
    pub(crate) fn onnx(&self) -> Vec<(String, OnnxAttr)> {
        use crate::proto::attribute_proto::AttributeType as T;
        let value = |a: &AttributeProto| match a.r#type.and_then(|t| T::try_from(t).ok()) {
            Some(T::Int) => a.i.map(OnnxAttr::Int),
            Some(T::Float) => a.f.map(OnnxAttr::Float),
            Some(T::String) => {
                a.s.as_deref()
                    .and_then(|b| std::str::from_utf8(b).ok())
                    .map(|s| OnnxAttr::Str(s.to_string()))
            }
            Some(T::Ints) => Some(OnnxAttr::Ints(a.ints.clone())),
            Some(T::Floats) => Some(OnnxAttr::Floats(a.floats.clone())),
            _ => None,
        };
        self.node
            .attribute
            .iter()
            .map(|a| {
                let name = a.name.clone().unwrap_or_default();
                (name, value(a).unwrap_or(OnnxAttr::Other))
            })
            .collect()
    }

    /// Names of every attribute (for "unsupported attribute" checks).
    pub(crate) fn names(&self) -> impl Iterator<Item = &'a str> {
        self.node.attribute.iter().filter_map(|a| a.name.as_deref())
    }
}
