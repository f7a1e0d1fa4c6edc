//! Symbolic integers: polynomials with integer coefficients over named dimension
//! symbols (the batch `B`, an index count `nnz_0`, ...), as shape arithmetic in ONNX
//! exports computes them (`Shape -> Gather -> Mul -> Concat`, `ReduceProd` of a
//! shape, `Size`, `dim_param`s such as `"s32 + 1"`).
//!
//! A [`SymI`] is kept in a normal form (monomials sorted, zero terms dropped), so two
//! expressions are equal exactly when their forms are equal: `3*B == B*3`,
//! `(B+1)-1 == B`. Division is exact only (`6*B / 3 == 2*B`; `B / 2` has no value).

use std::collections::BTreeMap;
use std::fmt;

/// A monomial: its symbols, sorted, with repetition for powers (`B*B`).
type Mono = Vec<String>;

/// A symbolic integer in normal form.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub(crate) struct SymI {
    terms: BTreeMap<Mono, i64>,
}

impl SymI {
    /// A known integer.
    pub(crate) fn int(v: i64) -> Self {
        let mut terms = BTreeMap::new();
        if v != 0 {
            terms.insert(Vec::new(), v);
        }
        SymI { terms }
    }

    /// A symbol.
    pub(crate) fn sym(s: &str) -> Self {
        let mut terms = BTreeMap::new();
        terms.insert(vec![s.to_string()], 1);
        SymI { terms }
    }

    /// The value, when it is a known integer.
    pub(crate) fn as_int(&self) -> Option<i64> {
        match self.terms.len() {
            0 => Some(0),
            1 => self.terms.get(&Vec::new()).copied(),
            _ => None,
        }
    }

    /// The symbol, when the expression is exactly one symbol.
    pub(crate) fn as_sym(&self) -> Option<&str> {
        match self.terms.iter().next() {
            Some((m, 1)) if self.terms.len() == 1 && m.len() == 1 => Some(&m[0]),
            _ => None,
        }
    }

    /// `(c, syms)` when the expression is one monomial `c * s1 * s2 ...` with c > 0.
    pub(crate) fn as_monomial(&self) -> Option<(i64, &[String])> {
        match self.terms.iter().next() {
            Some((m, &c)) if self.terms.len() == 1 && c > 0 => Some((c, m)),
            _ => None,
        }
    }

    fn combine(&self, other: &SymI, sign: i64) -> Option<SymI> {
        let mut terms = self.terms.clone();
        for (m, &c) in &other.terms {
            let e = terms.entry(m.clone()).or_insert(0);
            *e = e.checked_add(c.checked_mul(sign)?)?;
            if *e == 0 {
                terms.remove(m);
            }
        }
        Some(SymI { terms })
    }

    /// `self + other` (`None` on overflow).
    pub(crate) fn add(&self, other: &SymI) -> Option<SymI> {
        self.combine(other, 1)
    }

    /// `self - other` (`None` on overflow).
    pub(crate) fn sub(&self, other: &SymI) -> Option<SymI> {
        self.combine(other, -1)
    }

    /// `self * other` (`None` on overflow).
    pub(crate) fn mul(&self, other: &SymI) -> Option<SymI> {
        let mut out = SymI::default();
        for (ma, &ca) in &self.terms {
            for (mb, &cb) in &other.terms {
                let mut m = ma.clone();
                m.extend(mb.iter().cloned());
                m.sort();
                let mut t = SymI::default();
                t.terms.insert(m, ca.checked_mul(cb)?);
                out = out.add(&t)?;
            }
        }
        Some(out)
    }

    /// `self / d` for a known `d`: exact (every coefficient a multiple of `d`), or
    /// truncating when `self` is known too (ONNX's integer `Div`).
    pub(crate) fn div(&self, other: &SymI) -> Option<SymI> {
        let d = other.as_int()?;
        if d == 0 {
            return None;
        }
        if let Some(a) = self.as_int() {
            return Some(SymI::int(a.checked_div(d)?));
        }
        let mut terms = BTreeMap::new();
        for (m, &c) in &self.terms {
            if c % d != 0 {
                return None;
            }
            terms.insert(m.clone(), c / d);
        }
        Some(SymI { terms })
    }

    /// Parses a `dim_param` written as an expression: symbols, integers, `+`, `-`,
    /// `*` and parentheses (`"s32 + 1"`, `"2*s0"`). `None` for anything else.
    pub(crate) fn parse(text: &str, sym: &dyn Fn(&str) -> String) -> Option<SymI> {
        let toks = tokens(text)?;
        let mut p = Parser { toks, at: 0, sym };
        let e = p.sum()?;
        (p.at == p.toks.len()).then_some(e)
    }
}

impl SymI {
    /// The expression with `sym` replaced by `by`.
    pub(crate) fn substitute(&self, sym: &str, by: &SymI) -> Option<SymI> {
        let mut out = SymI::default();
        for (m, &c) in &self.terms {
            let mut t = SymI::int(c);
            for s in m {
                t = t.mul(&if s == sym { by.clone() } else { SymI::sym(s) })?;
            }
            out = out.add(&t)?;
        }
        Some(out)
    }

    /// The IR's dimension expression with the same value.
    pub(crate) fn to_dim_expr(&self) -> Option<dlrm_ir::DimExpr> {
        let mut out = dlrm_ir::DimExpr::int(0);
        for (m, &c) in &self.terms {
            let mut t = dlrm_ir::DimExpr::int(c);
            for s in m {
                t = t.mul(&dlrm_ir::DimExpr::sym(s))?;
            }
            out = out.add(&t)?;
        }
        Some(out)
    }

    /// The symbolic integer of an IR dimension expression.
    pub(crate) fn from_dim_expr(e: &dlrm_ir::DimExpr) -> Option<SymI> {
        SymI::parse(&e.to_string(), &|x| x.to_string())
    }
}

impl fmt::Display for SymI {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.terms.is_empty() {
            return f.write_str("0");
        }
        // Symbolic terms first, the constant last: `B*3+1`.
        let mut first = true;
        let mut parts: Vec<(&Mono, i64)> = self.terms.iter().map(|(m, &c)| (m, c)).collect();
        parts.sort_by_key(|(m, _)| m.is_empty());
        for (m, c) in parts {
            let neg = c < 0;
            if !first {
                f.write_str(if neg { "-" } else { "+" })?;
            } else if neg {
                f.write_str("-")?;
            }
            first = false;
            let a = c.unsigned_abs();
            if m.is_empty() {
                write!(f, "{a}")?;
                continue;
            }
            f.write_str(&m.join("*"))?;
            if a != 1 {
                write!(f, "*{a}")?;
            }
        }
        Ok(())
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Int(i64),
    Id(String),
    Op(char),
}

fn tokens(text: &str) -> Option<Vec<Tok>> {
    let mut out = Vec::new();
    let cs: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < cs.len() {
        let c = cs[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_digit() {
            let s = i;
            while i < cs.len() && cs[i].is_ascii_digit() {
                i += 1;
            }
            out.push(Tok::Int(cs[s..i].iter().collect::<String>().parse().ok()?));
        } else if c.is_alphabetic() || c == '_' {
            let s = i;
            while i < cs.len() && (cs[i].is_alphanumeric() || cs[i] == '_' || cs[i] == '.') {
                i += 1;
            }
            out.push(Tok::Id(cs[s..i].iter().collect()));
        } else if "+-*()".contains(c) {
            out.push(Tok::Op(c));
            i += 1;
        } else {
            return None;
        }
    }
    Some(out)
}

struct Parser<'a> {
    toks: Vec<Tok>,
    at: usize,
    sym: &'a dyn Fn(&str) -> String,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.at)
    }
    fn sum(&mut self) -> Option<SymI> {
        let mut acc = self.product()?;
        while let Some(Tok::Op(c @ ('+' | '-'))) = self.peek().cloned() {
            self.at += 1;
            let r = self.product()?;
            acc = if c == '+' { acc.add(&r)? } else { acc.sub(&r)? };
        }
        Some(acc)
    }
    fn product(&mut self) -> Option<SymI> {
        let mut acc = self.atom()?;
        while let Some(Tok::Op('*')) = self.peek() {
            self.at += 1;
            acc = acc.mul(&self.atom()?)?;
        }
        Some(acc)
    }
    fn atom(&mut self) -> Option<SymI> {
        let t = self.peek()?.clone();
        self.at += 1;
        match t {
            Tok::Int(v) => Some(SymI::int(v)),
            Tok::Id(s) => Some(SymI::sym(&(self.sym)(&s))),
            Tok::Op('-') => SymI::int(0).sub(&self.atom()?),
            Tok::Op('(') => {
                let e = self.sum()?;
                (self.peek() == Some(&Tok::Op(')'))).then_some(())?;
                self.at += 1;
                Some(e)
            }
            Tok::Op(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> SymI {
        SymI::parse(s, &|x| x.to_string()).unwrap_or_else(|| panic!("parse {s}"))
    }

    #[test]
    fn normal_form_makes_equal_expressions_equal() {
        assert_eq!(p("3*B"), p("B*3"));
        assert_eq!(p("(s32 + 1) - 1"), p("s32"));
        assert_eq!(p("B*10").to_string(), "B*10");
        assert_eq!(p("s32 + 1").to_string(), "s32+1");
        assert_eq!(p("2*(B+3) - 6"), p("B*2"));
        assert_eq!(p("B - B").as_int(), Some(0));
        assert_eq!(p("B").as_sym(), Some("B"));
        assert_eq!(
            p("B*N").as_monomial().map(|(c, m)| (c, m.len())),
            Some((1, 2))
        );
    }

    #[test]
    fn division_is_exact_or_nothing() {
        assert_eq!(p("B*6").div(&SymI::int(3)), Some(p("2*B")));
        assert_eq!(p("B").div(&SymI::int(2)), None);
        assert_eq!(p("7").div(&SymI::int(2)), Some(SymI::int(3)));
        assert_eq!(p("B").div(&SymI::int(0)), None);
        assert_eq!(p("B").div(&p("B")), None);
    }

    #[test]
    fn prints_and_refuses_bad_text() {
        assert_eq!(p("B*B + 2*N - 1").to_string(), "B*B+N*2-1");
        for bad in ["", "B +", "(B", "B / 2", "B ^ 2", "3 4"] {
            assert!(SymI::parse(bad, &|x| x.to_string()).is_none(), "{bad}");
        }
        assert!(SymI::int(i64::MAX).add(&SymI::int(1)).is_none());
    }
}
