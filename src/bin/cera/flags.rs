//! `--flag value` pairs of the bench commands whose every flag takes a number or a list of them.

use cera_web::{Error, Result};

/// One `--flag value` pair.
pub struct Pair<'a> {
    pub flag: &'a str,
    value: &'a str,
}

impl Pair<'_> {
    pub fn num(&self) -> Result<u32> {
        num(self.flag, self.value)
    }

    /// A comma-separated list of numbers (`--tokens 1,2,4`).
    pub fn nums(&self) -> Result<Vec<u32>> {
        self.value.split(',').map(|v| num(self.flag, v)).collect()
    }

    /// The error for a flag the command does not have.
    pub fn unknown(&self, usage: &str) -> Error {
        Error::invalid(format!("unknown flag {}; usage: {usage}", self.flag))
    }
}

fn num(flag: &str, v: &str) -> Result<u32> {
    v.parse::<u32>()
        .map_err(|_| Error::invalid(format!("{flag}: {v:?} is not a number")))
}

/// `args` as pairs; a flag without its value is an error naming `usage`.
pub fn pairs<'a>(args: &'a [String], usage: &str) -> Result<Vec<Pair<'a>>> {
    args.chunks(2)
        .map(|c| match c {
            [flag, value] => Ok(Pair { flag, value }),
            [flag] => Err(Error::invalid(format!(
                "{flag} needs a value; usage: {usage}"
            ))),
            _ => unreachable!("chunks of 2"),
        })
        .collect()
}
