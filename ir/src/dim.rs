//! Dimension expressions: polynomials with integer coefficients over named
//! symbols (`B+1`, `F*B`, `B*2-1`), the sizes of [`Dim::Expr`](crate::Dim::Expr).
//!
//! A [`DimExpr`] is kept in a normal form (monomials sorted, zero terms dropped), so
//! two expressions are equal exactly when their forms are equal: `3*B == B*3`,
//! `(B+1)-1 == B`. Division is exact only. An expression is evaluated with a symbol
//! binding, and [`solve`] finds the one unbound symbol of a linear term from a size
//! seen at run time (`B+1 = 8` gives `B = 7`).

use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// A monomial: its symbols, sorted, with repetition for powers (`B*B`).
type Mono = Vec<String>;

/// A symbolic integer in normal form.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct DimExpr {
    terms: BTreeMap<Mono, i64>,
}

impl DimExpr {
    /// A known integer.
    pub fn int(v: i64) -> Self {
        let mut terms = BTreeMap::new();
        if v != 0 {
            terms.insert(Vec::new(), v);
        }
        DimExpr { terms }
    }

    /// A symbol.
    pub fn sym(s: &str) -> Self {
        let mut terms = BTreeMap::new();
        terms.insert(vec![s.to_string()], 1);
        DimExpr { terms }
    }

    /// The value, when the expression is a known integer.
    pub fn as_int(&self) -> Option<i64> {
        match self.terms.len() {
            0 => Some(0),
            1 => self.terms.get(&Vec::new()).copied(),
            _ => None,
        }
    }

    /// Provably `>= 0` whatever the symbols' values: every coefficient is (the
    /// symbols are sizes, never negative). `B`, `B+1`, `2*B*F` are; `B-1` is not.
    pub fn non_negative(&self) -> bool {
        self.terms.values().all(|&c| c >= 0)
    }

    /// The symbol, when the expression is exactly one symbol.
    pub fn as_sym(&self) -> Option<&str> {
        match self.terms.iter().next() {
            Some((m, 1)) if self.terms.len() == 1 && m.len() == 1 => Some(&m[0]),
            _ => None,
        }
    }

    /// The symbols the expression mentions, sorted, without repetition.
    pub fn symbols(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self
            .terms
            .keys()
            .flat_map(|m| m.iter().map(String::as_str))
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    fn combine(&self, other: &DimExpr, sign: i64) -> Option<DimExpr> {
        let mut terms = self.terms.clone();
        for (m, &c) in &other.terms {
            let e = terms.entry(m.clone()).or_insert(0);
            *e = e.checked_add(c.checked_mul(sign)?)?;
            if *e == 0 {
                terms.remove(m);
            }
        }
        Some(DimExpr { terms })
    }

    /// `self + other` (`None` on overflow).
    pub fn add(&self, other: &DimExpr) -> Option<DimExpr> {
        self.combine(other, 1)
    }

    /// `self - other` (`None` on overflow).
    pub fn sub(&self, other: &DimExpr) -> Option<DimExpr> {
        self.combine(other, -1)
    }

    /// `self * other` (`None` on overflow).
    pub fn mul(&self, other: &DimExpr) -> Option<DimExpr> {
        let mut out = DimExpr::default();
        for (ma, &ca) in &self.terms {
            for (mb, &cb) in &other.terms {
                let mut m = ma.clone();
                m.extend(mb.iter().cloned());
                m.sort();
                let mut t = DimExpr::default();
                t.terms.insert(m, ca.checked_mul(cb)?);
                out = out.add(&t)?;
            }
        }
        Some(out)
    }

    /// `self / d` for a known non-zero `d`, when every coefficient is a multiple of
    /// `d` (`6*B / 3 == 2*B`; `B / 2` has no value).
    pub fn div_exact(&self, d: i64) -> Option<DimExpr> {
        if d == 0 {
            return None;
        }
        let mut terms = BTreeMap::new();
        for (m, &c) in &self.terms {
            if c % d != 0 {
                return None;
            }
            terms.insert(m.clone(), c / d);
        }
        Some(DimExpr { terms })
    }

    /// The expression with `sym` replaced by `by`.
    pub fn substitute(&self, sym: &str, by: &DimExpr) -> Option<DimExpr> {
        let mut out = DimExpr::default();
        for (m, &c) in &self.terms {
            let mut t = DimExpr::int(c);
            for s in m {
                t = if s == sym {
                    t.mul(by)?
                } else {
                    t.mul(&DimExpr::sym(s))?
                };
            }
            out = out.add(&t)?;
        }
        Some(out)
    }

    /// `r` such that `self == 0` exactly when `sym == r`: `self` is `±sym + rest`
    /// with `rest` free of `sym` (`n - 1 - B` solved for `n` is `B+1`).
    pub fn solve_for(&self, sym: &str) -> Option<DimExpr> {
        let mono = vec![sym.to_string()];
        let c = *self.terms.get(&mono)?;
        let mut rest = self.clone();
        rest.terms.remove(&mono);
        if rest.symbols().contains(&sym) || c.abs() != 1 {
            return None;
        }
        // c*sym + rest = 0  =>  sym = -rest / c.
        DimExpr::int(0).sub(&rest)?.div_exact(c)
    }

    /// The value with every symbol bound (`None` if one is unbound, on overflow, or
    /// when negative).
    pub fn eval(&self, bind: &dyn Fn(&str) -> Option<usize>) -> Option<usize> {
        let mut acc: i64 = 0;
        for (m, &c) in &self.terms {
            let mut t = c;
            for s in m {
                t = t.checked_mul(i64::try_from(bind(s)?).ok()?)?;
            }
            acc = acc.checked_add(t)?;
        }
        usize::try_from(acc).ok()
    }

    /// `(s, c, r)` when the expression is `c*s + r` with `s` the one symbol `bound`
    /// does not know, to the first power in every term it appears in, and `c`, `r`
    /// the values of the rest under `bound` (`B*F + 1` with `F = 3`: `(B, 3, 1)`).
    fn linear_in_unbound(
        &self,
        bound: &dyn Fn(&str) -> Option<usize>,
    ) -> Option<(String, i64, i64)> {
        let free: Vec<&str> = self
            .symbols()
            .into_iter()
            .filter(|s| bound(s).is_none())
            .collect();
        let [s] = free[..] else { return None };
        let (mut c, mut r) = (0i64, 0i64);
        for (m, &k) in &self.terms {
            let mut v = k;
            let mut has = false;
            for x in m {
                if x == s {
                    if has {
                        return None; // s*s
                    }
                    has = true;
                } else {
                    v = v.checked_mul(i64::try_from(bound(x)?).ok()?)?;
                }
            }
            if has {
                c = c.checked_add(v)?;
            } else {
                r = r.checked_add(v)?;
            }
        }
        Some((s.to_string(), c, r))
    }
}

impl DimExpr {
    /// Parses the printed form: terms joined by `+` (or starting with a negative
    /// integer), each a product of symbols and integers joined by `*` (`B+1`,
    /// `B*F`, `B-2*N`, `s32 + 1`). `None` for anything else.
    pub fn parse(text: &str) -> Option<DimExpr> {
        let cs: Vec<char> = text.chars().filter(|c| !c.is_whitespace()).collect();
        let mut i = 0;
        let mut sum = DimExpr::default();
        let mut first = true;
        while i < cs.len() || first {
            if !first {
                if cs[i] == '+' {
                    i += 1;
                } else if cs[i] != '-' {
                    return None;
                }
            }
            first = false;
            let mut term = DimExpr::int(1);
            loop {
                let start = i;
                if cs.get(i) == Some(&'-') {
                    i += 1;
                }
                let f = match cs.get(i) {
                    Some(c) if c.is_ascii_digit() => {
                        while cs.get(i).is_some_and(char::is_ascii_digit) {
                            i += 1;
                        }
                        DimExpr::int(cs[start..i].iter().collect::<String>().parse().ok()?)
                    }
                    Some(c) if (c.is_alphabetic() || *c == '_') && start == i => {
                        while cs.get(i).is_some_and(|c| c.is_alphanumeric() || *c == '_') {
                            i += 1;
                        }
                        DimExpr::sym(&cs[start..i].iter().collect::<String>())
                    }
                    _ => return None,
                };
                term = term.mul(&f)?;
                if cs.get(i) == Some(&'*') {
                    i += 1;
                } else {
                    break;
                }
            }
            sum = sum.add(&term)?;
        }
        Some(sum)
    }
}

/// Binds the unbound symbol of `e` so that `e == n`, when `e` is linear in its one
/// unbound symbol (`B+1 = 8` gives `B = 7`; `2*B = 7` has no solution). Returns the
/// symbol and its value; `Ok(None)` when `e` has no unbound symbol or more than
/// one, or is not linear in it; `Err` when no non-negative integer solves it.
pub fn solve(
    e: &DimExpr,
    n: usize,
    bound: &dyn Fn(&str) -> Option<usize>,
) -> Result<Option<(String, usize)>, String> {
    let Some((s, c, r)) = e.linear_in_unbound(bound) else {
        return Ok(None);
    };
    let n = i64::try_from(n).map_err(|_| format!("size {n} is too large"))?;
    let diff = n - r;
    if c == 0 || diff % c != 0 || diff / c < 0 {
        return Err(format!("no size of {s} makes {e} equal {n}"));
    }
    Ok(Some((s, (diff / c) as usize)))
}

/// Binds the symbols of `dims` from the sizes `sizes` (pairs of a dimension
/// expression and the size seen), into `syms`: plain symbols first, then
/// expressions solved for their one unbound symbol until nothing changes; finally
/// every expression is checked. Errors name the expression and the sizes.
pub fn bind_exprs(
    pairs: &[(DimExpr, usize)],
    syms: &mut HashMap<String, usize>,
) -> Result<(), String> {
    loop {
        let mut changed = false;
        for (e, n) in pairs {
            let found = {
                let bound = |s: &str| syms.get(s).copied();
                solve(e, *n, &bound)?
            };
            if let Some((s, v)) = found {
                syms.insert(s, v);
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    for (e, n) in pairs {
        let bound = |s: &str| syms.get(s).copied();
        if e.symbols().iter().all(|s| bound(s).is_some()) && e.eval(&bound) != Some(*n) {
            let vals: Vec<String> = e
                .symbols()
                .iter()
                .map(|s| format!("{s}={}", syms.get(*s).copied().unwrap_or(0)))
                .collect();
            return Err(format!(
                "dimension {e} is {n} here but {} with {}",
                e.eval(&bound)
                    .map_or_else(|| "negative".to_string(), |v| v.to_string()),
                vals.join(", ")
            ));
        }
    }
    Ok(())
}

impl fmt::Display for DimExpr {
    /// `B*3+1`, `B*F`, `B-1`, `B-2*N`: symbolic terms first, the constant last; a
    /// negative symbolic term is written `-c*syms` (the text form reads `-c` as a
    /// number).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.terms.is_empty() {
            return f.write_str("0");
        }
        let mut parts: Vec<(&Mono, i64)> = self.terms.iter().map(|(m, &c)| (m, c)).collect();
        parts.sort_by_key(|(m, _)| m.is_empty());
        for (i, (m, c)) in parts.into_iter().enumerate() {
            if m.is_empty() {
                if c < 0 || i == 0 {
                    write!(f, "{c}")?;
                } else {
                    write!(f, "+{c}")?;
                }
            } else if c < 0 {
                write!(f, "{c}*{}", m.join("*"))?;
            } else {
                if i > 0 {
                    f.write_str("+")?;
                }
                f.write_str(&m.join("*"))?;
                if c != 1 {
                    write!(f, "*{c}")?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests fail loudly")]
mod tests {
    use super::*;

    fn s(x: &str) -> DimExpr {
        DimExpr::sym(x)
    }
    fn k(v: i64) -> DimExpr {
        DimExpr::int(v)
    }

    #[test]
    fn non_negative_is_what_holds_for_every_size() {
        assert!(k(0).non_negative() && s("B").non_negative());
        assert!(s("B").add(&k(1)).unwrap().non_negative());
        assert!(s("B").mul(&s("F")).unwrap().non_negative());
        assert!(!s("B").sub(&k(1)).unwrap().non_negative());
        assert!(!k(-2).non_negative());
    }

    #[test]
    fn normal_form_and_printing() {
        let b1 = s("B").add(&k(1)).unwrap();
        assert_eq!(b1.to_string(), "B+1");
        assert_eq!(b1.sub(&k(1)).unwrap(), s("B"));
        let fb = s("F").mul(&s("B")).unwrap();
        assert_eq!(fb, s("B").mul(&s("F")).unwrap());
        assert_eq!(fb.to_string(), "B*F");
        assert_eq!(s("B").mul(&k(3)).unwrap().to_string(), "B*3");
        assert_eq!(s("B").sub(&k(1)).unwrap().to_string(), "B-1");
        assert_eq!(
            s("B").sub(&s("N").mul(&k(2)).unwrap()).unwrap().to_string(),
            "B-2*N"
        );
        assert_eq!(s("B").mul(&k(6)).unwrap().div_exact(3), s("B").mul(&k(2)));
        assert_eq!(s("B").div_exact(2), None);
        assert_eq!(
            b1.substitute("B", &s("F").mul(&s("B")).unwrap())
                .unwrap()
                .to_string(),
            "B*F+1"
        );
    }

    #[test]
    fn parses_what_it_prints() {
        for t in ["B+1", "B*F", "B-1", "B-2*N", "B*3+1", "7", "-4", "N"] {
            let e = DimExpr::parse(t).unwrap_or_else(|| panic!("{t}"));
            assert_eq!(e.to_string(), t);
        }
        assert_eq!(
            DimExpr::parse("s32 + 1").map(|e| e.to_string()),
            Some("s32+1".into())
        );
        assert_eq!(DimExpr::parse("2*B"), DimExpr::parse("B*2"));
        for bad in ["", "B+", "B/2", "(B)", "B--1", "B*"] {
            assert!(DimExpr::parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn evaluation_and_solving() {
        let b1 = s("B").add(&k(1)).unwrap();
        let none = |_: &str| None;
        assert_eq!(solve(&b1, 8, &none), Ok(Some(("B".into(), 7))));
        assert!(solve(&b1, 0, &none).is_err());
        let two_b = s("B").mul(&k(2)).unwrap();
        assert!(solve(&two_b, 7, &none).is_err());
        let fb = s("F").mul(&s("B")).unwrap();
        assert_eq!(solve(&fb, 12, &none), Ok(None));
        let f3 = |x: &str| (x == "F").then_some(3);
        assert_eq!(solve(&fb, 12, &f3), Ok(Some(("B".into(), 4))));
        assert_eq!(fb.eval(&|x| Some(if x == "F" { 3 } else { 4 })), Some(12));
        let mut syms = HashMap::new();
        bind_exprs(
            &[(b1.clone(), 8), (s("B").mul(&k(2)).unwrap(), 14)],
            &mut syms,
        )
        .unwrap();
        assert_eq!(syms["B"], 7);
        let e = bind_exprs(&[(b1.clone(), 9)], &mut syms).unwrap_err();
        assert!(e.contains("B+1 is 9 here but 8"), "{e}");
        let minus = s("B").sub(&k(1)).unwrap();
        let mut syms = HashMap::new();
        bind_exprs(&[(minus, 6)], &mut syms).unwrap();
        assert_eq!(syms["B"], 7);
        let eq = s("n").sub(&k(1)).unwrap().sub(&s("B")).unwrap();
        assert_eq!(eq.solve_for("n").map(|e| e.to_string()), Some("B+1".into()));
        assert_eq!(eq.solve_for("B").map(|e| e.to_string()), Some("n-1".into()));
        assert_eq!(s("n").mul(&k(2)).unwrap().solve_for("n"), None);
    }
}
