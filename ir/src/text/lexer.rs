//! The lexer of the text form: characters to tokens, each with its 1-based line and
//! column (columns count characters, not bytes; a tab is one column).
//!
//! Invariants: the token list always ends with exactly one [`Tok::Eof`] or
//! [`Tok::Error`] token, and nothing follows it. Lexing stops at the first bad
//! character; the parser reports that error only when it reaches it, so errors come
//! out in source order. `;` starts a comment that runs to the end of the line;
//! whitespace (including `\r`) only separates tokens.

use std::fmt;

/// One token kind.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Tok {
    /// `%name` (the name without `%`).
    Value(String),
    /// `@name` (the name without `@`).
    Graph(String),
    /// A bare identifier: keywords, op mnemonics, dtypes, attribute names, symbols.
    Ident(String),
    /// A numeric literal as written: `-?digits[.digits][e[+-]digits]` or `-inf`.
    Number(String),
    /// One of `{ } [ ] : , = + *`.
    Punct(char),
    /// `<-`.
    Arrow,
    /// End of input.
    Eof,
    /// A lexical error; the token list ends here.
    Error(String),
}

impl fmt::Display for Tok {
    /// How a token is named in "found ..." diagnostics.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Value(s) => write!(f, "`%{s}`"),
            Tok::Graph(s) => write!(f, "`@{s}`"),
            Tok::Ident(s) | Tok::Number(s) => write!(f, "`{s}`"),
            Tok::Punct(c) => write!(f, "`{c}`"),
            Tok::Arrow => f.write_str("`<-`"),
            Tok::Eof => f.write_str("end of input"),
            Tok::Error(reason) => f.write_str(reason),
        }
    }
}

/// A token and where it starts.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Token {
    /// The kind.
    pub tok: Tok,
    /// 1-based line.
    pub line: usize,
    /// 1-based column (in characters).
    pub col: usize,
}

/// True for the characters of a value name after `%`.
pub(crate) fn is_value_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '.'
}

/// True for the characters of a graph name after `@`.
pub(crate) fn is_graph_char(c: char) -> bool {
    is_value_char(c) || c == '-'
}

fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_'
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

struct Lexer {
    chars: Vec<char>,
    i: usize,
    line: usize,
    col: usize,
}

impl Lexer {
    fn peek_at(&self, k: usize) -> Option<char> {
        self.chars.get(self.i + k).copied()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.chars.get(self.i).copied()?;
        self.i += 1;
        if c == '\n' {
            self.line += 1;
            self.col = 1;
        } else {
            self.col += 1;
        }
        Some(c)
    }

    fn take_while(&mut self, pred: impl Fn(char) -> bool) -> String {
        let mut s = String::new();
        while let Some(c) = self.peek_at(0).filter(|&c| pred(c)) {
            s.push(c);
            self.bump();
        }
        s
    }

    fn skip_trivia(&mut self) {
        while let Some(c) = self.peek_at(0) {
            if c == ';' {
                while self.peek_at(0).is_some_and(|c| c != '\n') {
                    self.bump();
                }
            } else if c.is_whitespace() {
                self.bump();
            } else {
                break;
            }
        }
    }

    /// Lexes a number starting at the current character (a digit or `-`).
    fn number(&mut self) -> Tok {
        let mut s = String::new();
        if self.peek_at(0) == Some('-') {
            s.push('-');
            self.bump();
            if self.peek_at(0) == Some('i') {
                let word = self.take_while(is_ident_char);
                return if word == "inf" {
                    Tok::Number("-inf".into())
                } else {
                    Tok::Error(format!("expected a number after `-`, found `{word}`"))
                };
            }
            if !self.peek_at(0).is_some_and(|c| c.is_ascii_digit()) {
                return Tok::Error(match self.peek_at(0) {
                    Some(c) => format!("expected a number after `-`, found `{c}`"),
                    None => "expected a number after `-`, found end of input".into(),
                });
            }
        }
        s.push_str(&self.take_while(|c| c.is_ascii_digit()));
        if self.peek_at(0) == Some('.') {
            s.push('.');
            self.bump();
            s.push_str(&self.take_while(|c| c.is_ascii_digit()));
        }
        if matches!(self.peek_at(0), Some('e' | 'E')) {
            let digit_at = |k: usize| self.peek_at(k).is_some_and(|c| c.is_ascii_digit());
            let signed = matches!(self.peek_at(1), Some('+' | '-'));
            if digit_at(1) || (signed && digit_at(2)) {
                for _ in 0..(if signed { 2 } else { 1 }) {
                    if let Some(c) = self.bump() {
                        s.push(c);
                    }
                }
                s.push_str(&self.take_while(|c| c.is_ascii_digit()));
            }
        }
        Tok::Number(s)
    }

    fn next_token(&mut self) -> Token {
        self.skip_trivia();
        let (line, col) = (self.line, self.col);
        let at = |tok| Token { tok, line, col };
        let Some(c) = self.peek_at(0) else {
            return at(Tok::Eof);
        };
        let tok = match c {
            '%' | '@' => {
                self.bump();
                let (name, kind) = if c == '%' {
                    (self.take_while(is_value_char), "value")
                } else {
                    (self.take_while(is_graph_char), "graph")
                };
                if name.is_empty() {
                    Tok::Error(match self.peek_at(0) {
                        Some(d) if !d.is_whitespace() => {
                            format!("expected a {kind} name after `{c}`, found `{d}`")
                        }
                        _ => format!("expected a {kind} name after `{c}`"),
                    })
                } else if c == '%' {
                    Tok::Value(name)
                } else {
                    Tok::Graph(name)
                }
            }
            '{' | '}' | '[' | ']' | ':' | ',' | '=' | '+' | '*' => {
                self.bump();
                Tok::Punct(c)
            }
            '<' => {
                self.bump();
                if self.peek_at(0) == Some('-') {
                    self.bump();
                    Tok::Arrow
                } else {
                    Tok::Error("unexpected character `<` (did you mean `<-`?)".into())
                }
            }
            '-' => self.number(),
            c if c.is_ascii_digit() => self.number(),
            c if is_ident_start(c) => Tok::Ident(self.take_while(is_ident_char)),
            c => Tok::Error(format!("unexpected character `{}`", c.escape_debug())),
        };
        at(tok)
    }
}

/// Splits `src` into tokens; the last token is [`Tok::Eof`] or [`Tok::Error`].
pub(crate) fn lex(src: &str) -> Vec<Token> {
    let mut lx = Lexer {
        chars: src.chars().collect(),
        i: 0,
        line: 1,
        col: 1,
    };
    let mut toks = Vec::new();
    loop {
        let t = lx.next_token();
        let last = matches!(t.tok, Tok::Eof | Tok::Error(_));
        toks.push(t);
        if last {
            return toks;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(src: &str) -> Vec<Tok> {
        lex(src).into_iter().map(|t| t.tok).collect()
    }

    #[test]
    fn tokens_and_positions() {
        let toks = lex("graph @g-1 {\n  ; note\n  %0.a: f32[B,4] <- -1.5e-3\n}");
        let got: Vec<(Tok, usize, usize)> =
            toks.into_iter().map(|t| (t.tok, t.line, t.col)).collect();
        assert_eq!(
            got,
            vec![
                (Tok::Ident("graph".into()), 1, 1),
                (Tok::Graph("g-1".into()), 1, 7),
                (Tok::Punct('{'), 1, 12),
                (Tok::Value("0.a".into()), 3, 3),
                (Tok::Punct(':'), 3, 7),
                (Tok::Ident("f32".into()), 3, 9),
                (Tok::Punct('['), 3, 12),
                (Tok::Ident("B".into()), 3, 13),
                (Tok::Punct(','), 3, 14),
                (Tok::Number("4".into()), 3, 15),
                (Tok::Punct(']'), 3, 16),
                (Tok::Arrow, 3, 18),
                (Tok::Number("-1.5e-3".into()), 3, 21),
                (Tok::Punct('}'), 4, 1),
                (Tok::Eof, 4, 2),
            ]
        );
    }

    #[test]
    fn numbers() {
        assert_eq!(
            kinds("1e5 2e x -inf 3.0"),
            vec![
                Tok::Number("1e5".into()),
                Tok::Number("2".into()),
                Tok::Ident("e".into()),
                Tok::Ident("x".into()),
                Tok::Number("-inf".into()),
                Tok::Number("3.0".into()),
                Tok::Eof
            ]
        );
    }

    #[test]
    fn errors_stop_lexing() {
        let toks = lex("é %x $ %y");
        assert_eq!(toks.len(), 1);
        assert_eq!(toks[0].tok, Tok::Error("unexpected character `é`".into()));
        let toks = lex("%x ; comment é\n  %");
        let last = toks.last().expect("at least one token");
        assert_eq!((last.line, last.col), (2, 3));
        assert_eq!(
            last.tok,
            Tok::Error("expected a value name after `%`".into())
        );
        assert_eq!(
            kinds("<x").last(),
            Some(&Tok::Error(
                "unexpected character `<` (did you mean `<-`?)".into()
            ))
        );
    }
}
