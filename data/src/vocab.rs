//! From raw 32-bit categorical ids to table rows.
//!
//! The reference DLRM (`data_utils.py`, `getCriteoAdData`) takes `int(hex, 16)`,
//! optionally `% max_ind_range`, and then always a per-feature dictionary that numbers
//! the distinct values in order of first appearance; a table's rows are its count of
//! distinct values. [`IdMapping::Vocabulary`] does exactly that, with a frequency
//! threshold on top: with `min_count` K > 1, ids seen fewer than K times all share one
//! row, the **last** one (`rows - 1`), so the frequent ids keep the reference's
//! numbering. With K = 1 (the default) the rows are the reference's, bit for bit.
//!
//! [`IdMapping::Hash`] skips the dictionary: row = `id % N`, rows = N; one pass, no
//! memory for vocabularies (the choice for Terabyte-size data).
//!
//! Vocabularies are built in one streaming pass (the converter counts while it writes
//! the raw ids, then rewrites each table's column through the vocabulary), in a hash
//! map per table: memory is about 16 bytes per distinct id, not per sample.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// How raw ids become rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdMapping {
    /// The reference's dictionary (first appearance order), after an optional modulo,
    /// with ids seen fewer than `min_count` times sharing the last row.
    Vocabulary {
        /// `--max-ind-range`: applied to the raw id before the dictionary.
        modulo: Option<u32>,
        /// `--min-count`: the frequency threshold (1 keeps every id).
        min_count: u32,
    },
    /// `id % modulo`, rows = `modulo`.
    Hash {
        /// The row count.
        modulo: u32,
    },
    /// Ids already mapped (preprocessed inputs), optionally `% modulo` as the
    /// reference's loaders do with `--max-ind-range`.
    AsIs {
        /// The optional modulo.
        modulo: Option<u32>,
    },
}

impl Default for IdMapping {
    fn default() -> Self {
        IdMapping::Vocabulary {
            modulo: None,
            min_count: 1,
        }
    }
}

impl IdMapping {
    /// The modulo applied to a raw id before anything else (if any).
    pub fn modulo(&self) -> Option<u32> {
        match *self {
            IdMapping::Vocabulary { modulo, .. } | IdMapping::AsIs { modulo } => modulo,
            IdMapping::Hash { modulo } => Some(modulo),
        }
    }

    /// The raw id after the modulo.
    #[inline]
    pub fn pre(&self, id: u32) -> u32 {
        match self.modulo() {
            Some(m) => id % m,
            None => id,
        }
    }

    /// A description for the manifest's `source`.
    pub fn describe(&self) -> serde_json::Value {
        match *self {
            IdMapping::Vocabulary { modulo, min_count } => serde_json::json!({
                "kind": "vocabulary", "order": "first-appearance",
                "max_ind_range": modulo, "min_count": min_count,
                "rare_row": if min_count > 1 { "last" } else { "none" },
            }),
            IdMapping::Hash { modulo } => {
                serde_json::json!({"kind": "hash", "max_ind_range": modulo})
            }
            IdMapping::AsIs { modulo } => {
                serde_json::json!({"kind": "as-is", "max_ind_range": modulo})
            }
        }
    }
}

/// A multiplicative hasher for u32 keys (the maps hold billions of lookups; SipHash
/// would dominate the conversion).
#[derive(Default, Clone, Copy)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
    }
    fn write_u32(&mut self, i: u32) {
        let x = u64::from(i).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = x ^ (x >> 29);
    }
}

type IdMap<V> = HashMap<u32, V, BuildHasherDefault<IdHasher>>;

/// Counts each table's ids, remembering the order of first appearance.
pub struct VocabCounter {
    tables: Vec<IdMap<(u32, u32)>>,
}

/// One table's vocabulary.
pub struct Vocab {
    map: IdMap<u32>,
    rows: u64,
    distinct: u64,
    rare_ids: u64,
    rare_row: Option<u32>,
}

impl Vocab {
    /// The row of (modulo-reduced) id `id`; ids never counted go to the rare row (or 0).
    #[inline]
    pub fn row(&self, id: u32) -> u32 {
        match self.map.get(&id) {
            Some(&r) => r,
            None => self.rare_row.unwrap_or(0),
        }
    }

    /// Rows of the table.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Distinct ids seen.
    pub fn distinct(&self) -> u64 {
        self.distinct
    }

    /// Distinct ids below the threshold (sharing the rare row).
    pub fn rare_ids(&self) -> u64 {
        self.rare_ids
    }
}

impl VocabCounter {
    /// A counter for `tables` tables.
    pub fn new(tables: usize) -> VocabCounter {
        VocabCounter {
            tables: (0..tables).map(|_| IdMap::default()).collect(),
        }
    }

    /// Counts table `t`'s ids, in order.
    pub fn observe(&mut self, t: usize, ids: impl Iterator<Item = u32>) {
        let map = &mut self.tables[t];
        for id in ids {
            let next = map.len() as u32;
            map.entry(id)
                .and_modify(|(c, _)| *c = c.saturating_add(1))
                .or_insert((1, next));
        }
    }

    /// Counts a batch's id columns (one per table), tables in parallel; the result
    /// does not depend on the thread count.
    pub fn observe_columns(&mut self, cols: &[Vec<u32>]) {
        use rayon::prelude::*;
        self.tables.par_iter_mut().zip(cols).for_each(|(map, ids)| {
            for &id in ids {
                let next = map.len() as u32;
                map.entry(id)
                    .and_modify(|(c, _)| *c = c.saturating_add(1))
                    .or_insert((1, next));
            }
        });
    }

    /// The vocabularies: ids seen at least `min_count` times numbered in order of
    /// first appearance, the rest sharing one last row.
    pub fn finish(self, min_count: u32) -> Vec<Vocab> {
        use rayon::prelude::*;
        self.tables
            .into_par_iter()
            .map(|counts| {
                let distinct = counts.len() as u64;
                let mut kept: Vec<(u32, u32)> = counts
                    .iter()
                    .filter(|(_, (c, _))| *c >= min_count)
                    .map(|(&id, &(_, first))| (first, id))
                    .collect();
                kept.sort_unstable();
                let rare_ids = distinct - kept.len() as u64;
                drop(counts);
                let mut map = IdMap::with_capacity_and_hasher(kept.len(), Default::default());
                for (row, &(_, id)) in kept.iter().enumerate() {
                    map.insert(id, row as u32);
                }
                let rare_row = (rare_ids > 0).then_some(kept.len() as u32);
                let rows = (kept.len() as u64 + u64::from(rare_ids > 0)).max(1);
                Vocab {
                    map,
                    rows,
                    distinct,
                    rare_ids,
                    rare_row,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_appearance_order_and_rare_row() {
        let mut c = VocabCounter::new(1);
        c.observe(0, [7, 3, 7, 9, 3, 7, 5].into_iter());
        let v = c.finish(1).remove(0);
        assert_eq!([7, 3, 9, 5].map(|id| v.row(id)), [0, 1, 2, 3]);
        assert_eq!((v.rows(), v.distinct(), v.rare_ids()), (4, 4, 0));

        let mut c = VocabCounter::new(1);
        c.observe(0, [7, 3, 7, 9, 3, 7, 5].into_iter());
        let v = c.finish(2).remove(0);
        assert_eq!([7, 3, 9, 5].map(|id| v.row(id)), [0, 1, 2, 2]);
        assert_eq!((v.rows(), v.distinct(), v.rare_ids()), (3, 4, 2));
    }

    #[test]
    fn batch_counting_matches_sequential() {
        let ids: Vec<[u32; 2]> = (0..1000u32).map(|i| [i * 7 % 13, i % 5]).collect();
        let mut a = VocabCounter::new(2);
        let cols: Vec<Vec<u32>> = (0..2).map(|t| ids.iter().map(|x| x[t]).collect()).collect();
        a.observe_columns(&cols[..]);
        let mut b = VocabCounter::new(2);
        for t in 0..2 {
            b.observe(t, ids.iter().map(|x| x[t]));
        }
        let (va, vb) = (a.finish(1), b.finish(1));
        for t in 0..2 {
            for id in 0..13 {
                assert_eq!(va[t].row(id), vb[t].row(id));
            }
        }
    }
}
