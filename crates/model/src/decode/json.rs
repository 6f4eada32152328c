//! One pass over a JSON record that picks out only the spec's paths.
//!
//! The record is never materialised as a `serde_json::Value`: a path tree built from the spec
//! guides a visitor that keeps a borrowed [`RawValue`] for each wanted leaf and skips everything
//! else. The leaves are then typed by [`super::value::parse_cell`].

use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use crate::spec::JsonPath;

/// A node of the path tree: an object whose named members are leaves or further objects.
#[derive(Debug, Default)]
pub(super) struct Node {
    /// Display form of this node's own path (for messages).
    pub path: String,
    pub children: Vec<(Box<str>, Child)>,
}

#[derive(Debug)]
pub(super) enum Child {
    /// A leaf; the number is its slot.
    Leaf(usize),
    Inner(Node),
}

impl Node {
    /// Builds the tree; returns it, the leaf slot of each path, and the number of slots.
    /// Paths that are equal share a slot.
    pub fn build(paths: &[&JsonPath]) -> (Node, Vec<usize>, usize) {
        let mut root = Node {
            path: "$".into(),
            children: Vec::new(),
        };
        let mut slots = 0;
        let slot_of = paths
            .iter()
            .map(|p| root.insert(&p.0, &mut slots))
            .collect();
        (root, slot_of, slots)
    }

    fn insert(&mut self, parts: &[String], slots: &mut usize) -> usize {
        let Some((first, rest)) = parts.split_first() else {
            return usize::MAX;
        };
        let pos = match self.find(first) {
            Some(p) => p,
            None => {
                let child = if rest.is_empty() {
                    *slots += 1;
                    Child::Leaf(*slots - 1)
                } else {
                    Child::Inner(Node {
                        path: format!("{}.{first}", self.path),
                        children: Vec::new(),
                    })
                };
                self.children.push((first.as_str().into(), child));
                self.children.len() - 1
            }
        };
        match &mut self.children[pos].1 {
            Child::Leaf(slot) => *slot,
            // The spec refuses a path inside another column's leaf, so `rest` is not empty here.
            Child::Inner(node) => node.insert(rest, slots),
        }
    }

    pub fn find(&self, key: &str) -> Option<usize> {
        self.children
            .iter()
            .position(|(k, _)| k.len() == key.len() && &**k == key)
    }
}

/// A value found where the tree expected an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Mismatch {
    /// Path of the node that should have been an object.
    pub path: String,
    /// What was there instead.
    pub found: &'static str,
}

/// Visits an object, filling `slots` with the raw values of the tree's leaves.
pub(super) struct ObjectSeed<'t, 's, 'de> {
    pub node: &'t Node,
    pub slots: &'s mut [Option<&'de RawValue>],
    pub mismatch: &'s mut Option<Mismatch>,
}

impl<'de> DeserializeSeed<'de> for ObjectSeed<'_, '_, 'de> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl ObjectSeed<'_, '_, '_> {
    fn found(self, found: &'static str) {
        if self.mismatch.is_none() {
            *self.mismatch = Some(Mismatch {
                path: self.node.path.clone(),
                found,
            });
        }
    }
}

impl<'de> Visitor<'de> for ObjectSeed<'_, '_, 'de> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(child) = map.next_key_seed(KeySeed(self.node))? {
            match child.map(|i| &self.node.children[i].1) {
                Some(Child::Leaf(slot)) => {
                    let raw: &'de RawValue = map.next_value()?;
                    self.slots[*slot] = Some(raw);
                }
                Some(Child::Inner(node)) => map.next_value_seed(ObjectSeed {
                    node,
                    slots: self.slots,
                    mismatch: self.mismatch,
                })?,
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        // `null` where an object was expected: every column below is absent.
        if self.node.path == "$" {
            self.found("null");
        }
        Ok(())
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.found("a boolean");
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.found("a number");
        Ok(())
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.found("a number");
        Ok(())
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.found("a number");
        Ok(())
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        self.found("a string");
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        self.found("an array");
        Ok(())
    }
}

/// Resolves a member name to the index of the node's child, without allocating.
struct KeySeed<'t>(&'t Node);

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = Option<usize>;

    fn deserialize<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Option<usize>, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed<'_> {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a member name")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<Option<usize>, E> {
        Ok(self.0.find(key))
    }
}
