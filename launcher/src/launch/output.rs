//! `[rank N] ` prefixes on every line of a rank's output, whatever the chunking it arrives in.

/// Buffers a rank's partial last line until its newline (or the end) arrives.
#[derive(Debug, Default)]
pub struct LinePrefixer {
    partial: String,
}

impl LinePrefixer {
    /// Complete lines of `data` (with what was buffered), each prefixed and newline-terminated.
    pub fn push(&mut self, rank: u32, data: &str) -> String {
        self.partial.push_str(data);
        let Some(end) = self.partial.rfind('\n') else {
            return String::new();
        };
        let rest = self.partial.split_off(end + 1);
        let whole = std::mem::replace(&mut self.partial, rest);
        whole
            .lines()
            .map(|l| format!("[rank {rank}] {l}\n"))
            .collect()
    }

    /// The unterminated last line, if any (at the end of the rank's output).
    pub fn finish(&mut self, rank: u32) -> String {
        let p = std::mem::take(&mut self.partial);
        if p.is_empty() {
            p
        } else {
            format!("[rank {rank}] {p}\n")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_split_across_pushes() {
        let mut p = LinePrefixer::default();
        assert_eq!(p.push(3, "hel"), "");
        assert_eq!(p.push(3, "lo\nwor"), "[rank 3] hello\n");
        assert_eq!(p.push(3, "ld\n\nx"), "[rank 3] world\n[rank 3] \n");
        assert_eq!(p.finish(3), "[rank 3] x\n");
        assert_eq!(p.finish(3), "");
    }
}
