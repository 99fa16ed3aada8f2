//! Checkpoints as users have them: one `.safetensors` file, a Hugging Face sharded checkpoint
//! (`model-00001-of-00004.safetensors` + `model.safetensors.index.json`), or a directory
//! written by `save_pretrained` (every other file in it carried verbatim). And a run directory:
//! one checkpoint per entry, sorted by step.

use std::path::{Path, PathBuf};

use super::format::Layout;
use crate::{Error, Result};

/// One file of a checkpoint source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceFile {
    /// Path inside the checkpoint (`/`-separated), as stored and extracted.
    pub rel: String,
    pub path: PathBuf,
    pub safetensors: bool,
}

/// A checkpoint to add to an archive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointSource {
    pub label: String,
    /// The step parsed from the name (`step000200`, `checkpoint-400`, ...), if any.
    pub step: Option<u64>,
    pub layout: Layout,
    pub files: Vec<SourceFile>,
}

fn is_safetensors(p: &Path) -> bool {
    p.extension().is_some_and(|e| e == "safetensors")
}

fn name_of(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| p.display().to_string())
}

/// The training step a file or directory name encodes: digits after `step`, `checkpoint`,
/// `ckpt`, `iter` or `global_step` (case-insensitive, `-`/`_` allowed between), else the last
/// run of digits in the name (extension removed), else `None`.
pub fn parse_step(name: &str) -> Option<u64> {
    let stem = name.strip_suffix(".safetensors").unwrap_or(name);
    let lower = stem.to_ascii_lowercase();
    let digits_at = |i: usize| -> Option<u64> {
        let rest = &lower[i..];
        let rest = rest.trim_start_matches(['-', '_', '=']);
        let d: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
        d.parse().ok()
    };
    for key in ["global_step", "checkpoint", "step", "ckpt", "iter"] {
        if let Some(i) = lower.rfind(key) {
            if let Some(v) = digits_at(i + key.len()) {
                return Some(v);
            }
        }
    }
    let bytes = lower.as_bytes();
    let end = bytes.iter().rposition(|b| b.is_ascii_digit())?;
    let start = bytes[..end]
        .iter()
        .rposition(|b| !b.is_ascii_digit())
        .map_or(0, |i| i + 1);
    lower[start..=end].parse().ok()
}

/// `model-00001-of-00004.safetensors` and the like.
fn is_shard_name(name: &str) -> bool {
    let Some(stem) = name.strip_suffix(".safetensors") else {
        return false;
    };
    let parts: Vec<&str> = stem.rsplitn(3, '-').collect();
    parts.len() == 3
        && parts[1] == "of"
        && parts[0].chars().all(|c| c.is_ascii_digit())
        && parts[2]
            .rsplit('-')
            .next()
            .is_some_and(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit()))
}

/// Extensions of PyTorch pickle checkpoints, which lockstep does not read.
const PICKLE_EXTENSIONS: [&str; 4] = ["bin", "pt", "pth", "ckpt"];

fn is_pickle(p: &Path) -> bool {
    p.extension()
        .is_some_and(|e| PICKLE_EXTENSIONS.iter().any(|x| e.eq_ignore_ascii_case(x)))
}

/// What to add to "no checkpoint here" when `dir` (or a directory in it) holds PyTorch
/// pickle checkpoints: that they are not read, and what to do.
fn pickle_hint(dir: &Path) -> String {
    let mut found = Vec::new();
    let mut look = |d: &Path, prefix: &str| {
        for p in list_dir(d).unwrap_or_default() {
            if p.is_file() && is_pickle(&p) {
                found.push(format!("{prefix}{}", name_of(&p)));
            }
        }
    };
    look(dir, "");
    for sub in list_dir(dir).unwrap_or_default() {
        if sub.is_dir() {
            look(&sub, &format!("{}/", name_of(&sub)));
        }
    }
    if found.is_empty() {
        return String::new();
    }
    let shown: Vec<&str> = found.iter().take(3).map(String::as_str).collect();
    format!(
        "; found {}{}: PyTorch pickle checkpoints (.bin, .pt, .pth, .ckpt) are not read. {PICKLE_ADVICE}",
        shown.join(", "),
        if found.len() > 3 {
            format!(" and {} more", found.len() - 3)
        } else {
            String::new()
        }
    )
}

const PICKLE_ADVICE: &str = "Convert them to safetensors first, e.g. \
    `model.save_pretrained(dir, safe_serialization=True)` (transformers) or \
    `safetensors.torch.save_file(state_dict, \"model.safetensors\")`";

fn list_dir(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .map(|e| e.map(|e| e.path()).map_err(|e| Error::io(dir, e)))
        .collect::<Result<_>>()?;
    v.sort();
    Ok(v)
}

/// Whether a directory is one checkpoint (rather than a run of them): it has a safetensors
/// index, exactly one `.safetensors` file, or only shard-named ones.
pub fn is_checkpoint_dir(dir: &Path) -> Result<bool> {
    let entries = list_dir(dir)?;
    let st: Vec<String> = entries
        .iter()
        .filter(|p| p.is_file() && is_safetensors(p))
        .map(|p| name_of(p))
        .collect();
    let has_index = entries
        .iter()
        .any(|p| name_of(p).ends_with(".safetensors.index.json"));
    Ok(has_index || st.len() == 1 || (!st.is_empty() && st.iter().all(|n| is_shard_name(n))))
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<SourceFile>) -> Result<()> {
    for p in list_dir(dir)? {
        let meta = std::fs::symlink_metadata(&p).map_err(|e| Error::io(&p, e))?;
        let meta = if meta.file_type().is_symlink() {
            std::fs::metadata(&p).map_err(|e| Error::io(&p, e))?
        } else {
            meta
        };
        if meta.is_dir() {
            walk(root, &p, out)?;
        } else if meta.is_file() {
            let rel = p
                .strip_prefix(root)
                .expect("walked under root")
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/");
            out.push(SourceFile {
                rel,
                safetensors: is_safetensors(&p),
                path: p,
            });
        }
    }
    Ok(())
}

/// Resolve one checkpoint: a `.safetensors` file, a `*.safetensors.index.json` (its shards
/// and the other files of its directory), or a checkpoint directory.
pub fn resolve(path: &Path) -> Result<CheckpointSource> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if meta.is_file() {
        let name = name_of(path);
        if name.ends_with(".safetensors.index.json") {
            let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
            return resolve(dir.unwrap_or(Path::new(".")));
        }
        if is_pickle(path) {
            return Err(Error::Invalid(format!(
                "{}: a PyTorch pickle checkpoint, which lockstep does not read. {PICKLE_ADVICE}",
                path.display()
            )));
        }
        if !is_safetensors(path) {
            return Err(Error::Invalid(format!(
                "{}: not a checkpoint (expected a .safetensors file, a *.safetensors.index.json or a directory)",
                path.display()
            )));
        }
        return Ok(CheckpointSource {
            step: parse_step(&name),
            label: name.clone(),
            layout: Layout::SingleFile,
            files: vec![SourceFile {
                rel: name,
                path: path.to_path_buf(),
                safetensors: true,
            }],
        });
    }
    if !meta.is_dir() {
        // (The delta codec's commands read a pipe whole; an archive stores a checkpoint
        // under its file's name, mode and time, which a pipe does not have.)
        return Err(Error::Invalid(format!(
            "{}: {}, not a file; pack and append read checkpoints from files or directories",
            path.display(),
            crate::output::kind_of(&meta.file_type())
        )));
    }
    if !is_checkpoint_dir(path)? {
        return Err(Error::Invalid(format!(
            "{}: holds no checkpoint (no *.safetensors.index.json, and not one .safetensors file or a set of shards){}",
            path.display(),
            pickle_hint(path)
        )));
    }
    let mut files = Vec::new();
    walk(path, path, &mut files)?;
    // Every shard an index names must be present.
    for f in files
        .iter()
        .filter(|f| f.rel.ends_with(".safetensors.index.json"))
    {
        let text = std::fs::read(&f.path).map_err(|e| Error::io(&f.path, e))?;
        let json: serde_json::Value = serde_json::from_slice(&text).map_err(|e| {
            Error::format(format!("shard index {}", f.path.display()), e.to_string())
        })?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| {
                Error::format(
                    format!("shard index {}", f.path.display()),
                    "no \"weight_map\" object",
                )
            })?;
        let dir = f.rel.rsplit_once('/').map(|(d, _)| format!("{d}/"));
        for shard in map.values().filter_map(|v| v.as_str()) {
            let rel = format!("{}{shard}", dir.clone().unwrap_or_default());
            if !files.iter().any(|g| g.rel == rel) {
                return Err(Error::Invalid(format!(
                    "{}: the shard index names {shard}, which is missing",
                    path.display()
                )));
            }
        }
    }
    let label = name_of(&path.canonicalize().unwrap_or(path.to_path_buf()));
    Ok(CheckpointSource {
        step: parse_step(&label),
        label,
        layout: Layout::Directory,
        files,
    })
}

/// Resolve the arguments of `pack`: checkpoints in the order given, or, for a single
/// directory that is not itself a checkpoint, every checkpoint in it sorted by step.
pub fn resolve_many(paths: &[PathBuf]) -> Result<Vec<CheckpointSource>> {
    if let [dir] = paths {
        if dir.is_dir() && !is_checkpoint_dir(dir)? {
            let mut v = Vec::new();
            for p in list_dir(dir)? {
                let ok = if p.is_dir() {
                    is_checkpoint_dir(&p)?
                } else {
                    is_safetensors(&p)
                };
                if ok {
                    v.push(resolve(&p)?);
                }
            }
            if v.is_empty() {
                return Err(Error::Invalid(format!(
                    "{}: no checkpoints found (looked for .safetensors files and checkpoint directories){}",
                    dir.display(),
                    pickle_hint(dir)
                )));
            }
            if let Some(s) = v.iter().find(|s| s.step.is_none()) {
                return Err(Error::Invalid(format!(
                    "{}: cannot tell the step of {} (name the checkpoints in order instead)",
                    dir.display(),
                    s.label
                )));
            }
            v.sort_by_key(|s| s.step);
            if let Some(w) = v.windows(2).find(|w| w[0].step == w[1].step) {
                return Err(Error::Invalid(format!(
                    "{}: {} and {} are both step {} (pack the run's checkpoints of one kind, in order)",
                    dir.display(),
                    w[0].label,
                    w[1].label,
                    w[0].step.unwrap_or(0)
                )));
            }
            return Ok(v);
        }
    }
    paths.iter().map(|p| resolve(p)).collect()
}

/// Put explicitly listed checkpoints in training order when every one has a step in its name
/// (a shell glob sorts `step1000` before `step200`): a stable sort by step. Returns whether
/// the order changed. Leaves the list alone when some name has no step.
pub fn sort_by_step(sources: &mut [CheckpointSource]) -> bool {
    if sources.iter().any(|s| s.step.is_none()) || sources.is_sorted_by_key(|s| s.step) {
        return false;
    }
    sources.sort_by_key(|s| s.step);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_from_names() {
        assert_eq!(parse_step("gpt2_step000200_bf16.safetensors"), Some(200));
        assert_eq!(parse_step("checkpoint-1500"), Some(1500));
        assert_eq!(parse_step("global_step42"), Some(42));
        assert_eq!(parse_step("model_7.safetensors"), Some(7));
        assert_eq!(parse_step("model.safetensors"), None);
        assert!(is_shard_name("model-00001-of-00004.safetensors"));
        assert!(!is_shard_name("model.safetensors"));
    }
}
