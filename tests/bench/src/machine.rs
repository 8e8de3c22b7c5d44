//! The machine a benchmark ran on and the time it finished, as every result file names them.

use serde::{Deserialize, Serialize};

/// What the numbers were measured on.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Machine {
    /// CPU model name.
    pub cpu: String,
    /// Cores this process may use.
    pub cores: usize,
    /// Physical memory, GiB.
    pub memory_gib: f64,
}

impl Machine {
    /// Reads `/proc`.
    pub fn read() -> Self {
        let cpu = approxy_setup::cpu::CpuFeatures::this_machine().model;
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let kb: f64 = meminfo
            .lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|s| s.parse().ok())
            .unwrap_or(0.0);
        Self {
            cpu,
            cores: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(0),
            memory_gib: kb / 1024.0 / 1024.0,
        }
    }

    /// The machine in one line.
    pub fn line(&self) -> String {
        format!(
            "{} cores of {}, {:.0} GiB, no GPU",
            self.cores, self.cpu, self.memory_gib
        )
    }
}

/// The current UTC time as `YYYY-MM-DD HH:MM UTC`.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_413), (2025, 11, 21));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }
}
