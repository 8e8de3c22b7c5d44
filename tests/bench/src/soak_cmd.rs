//! `approxy bench soak`'s flags: a soak of one path, or the attack mix, which is a benchmark
//! of its own (`attack`) that takes its length and results directory from the soak's flags.

use super::attack::{self, AttackOptions};
use super::soak::{self, SoakOptions, SoakPhase};

/// `approxy bench soak`: a soak of the path `--phase` names, or the attack mix (a benchmark of
/// its own, in `attack`, that takes its length and results directory from the soak's flags).
#[derive(Debug, Clone, clap::Args)]
pub struct SoakArgs {
    /// "passthrough", "approximate" or "attack" (500 idle connections, 64 slow-body
    /// clients and 20 normal streaming clients at once, over a stub upstream).
    #[arg(long, value_enum, default_value = "passthrough")]
    phase: PhaseFlag,
    #[command(flatten)]
    options: SoakOptions,
}

/// What `--phase` names.
// No doc comments on the variants: clap would list them under `--phase` in `--help`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum PhaseFlag {
    Passthrough,
    Approximate,
    Attack,
}

impl SoakArgs {
    /// Runs what `--phase` names.
    pub async fn run(self) -> anyhow::Result<()> {
        let phase = match self.phase {
            PhaseFlag::Passthrough => SoakPhase::Passthrough,
            PhaseFlag::Approximate => SoakPhase::Approximate,
            PhaseFlag::Attack => {
                let SoakOptions { minutes, out, .. } = self.options;
                return attack::run(&AttackOptions { minutes, out }).await;
            }
        };
        soak::run(&SoakOptions {
            phase,
            ..self.options
        })
        .await
    }
}
