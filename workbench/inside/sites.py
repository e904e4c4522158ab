"""Sites inside the model, named as TransformerLens names its hook points.

`blocks.{l}.hook_resid_pre`, `hook_resid_mid`, `hook_resid_post`, `hook_attn_out`,
`hook_mlp_out`, `blocks.{l}.attn.hook_pattern`, `blocks.{l}.attn.hook_z` and
`ln_final.hook_normalized`, or their short forms (`resid_post`, `pattern`, ...) with a layer
given apart. `parse_site` reads a name, `site_name` writes one, `split_name` reads back a full
name this module wrote.

>>> site_name("resid_post", 3), parse_site("blocks.1.attn.hook_pattern", "capture.sites")
('blocks.3.hook_resid_post', ('pattern', 1))
"""

from __future__ import annotations

from typing import Any

from workbench.errors import refuse

# site -> what the engine records there (the table in docs/inside.md)
RESIDUAL_SITES = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")
LAYER_SITES = (*RESIDUAL_SITES, "pattern")
CAPTURE_SITES = (*LAYER_SITES, "normalized")
INTERVENTION_SITES = (*RESIDUAL_SITES, "z")
# the hook points inside an SAE spliced at a site, as SAELens names them
# (`blocks.6.hook_resid_post.hook_sae_acts_post`): captured from the site's rows through the SAE
SAE_HOOKS = ("input", "acts_pre", "acts_post", "recons", "error", "output")


def split_sae_name(name: Any) -> tuple[str, str] | None:
    """'blocks.6.hook_resid_post.hook_sae_acts_post' -> ('blocks.6.hook_resid_post',
    'acts_post'); None for a name without an SAE hook."""
    if not isinstance(name, str) or ".hook_sae_" not in name:
        return None
    base, _, hook = name.rpartition(".hook_sae_")
    return (base, hook) if hook in SAE_HOOKS else None


def site_name(site: str, layer: int | None) -> str:
    """The TransformerLens name of a site at a layer: ("resid_post", 3) ->
    'blocks.3.hook_resid_post'."""
    if site == "normalized":
        return "ln_final.hook_normalized"
    if site in ("pattern", "z"):
        return f"blocks.{layer}.attn.hook_{site}"
    return f"blocks.{layer}.hook_{site}"


def split_name(name: str) -> tuple[str, int | None]:
    """A full name `site_name` wrote -> (site, layer or None)."""
    if name == "ln_final.hook_normalized":
        return "normalized", None
    parts = name.split(".")
    return parts[-1].removeprefix("hook_"), int(parts[1])


def parse_site(name: Any, parameter: str) -> tuple[str, int | None]:
    """A site by its full name or short form -> (site, layer or None when not in the name);
    refused naming `parameter` otherwise."""
    if not isinstance(name, str):
        refuse(f"{parameter}: a site is a string such as 'blocks.0.hook_resid_post', got "
               f"{type(name).__name__}.", parameter, name)
    short = name.removeprefix("hook_").removeprefix("attn.hook_")
    if name in ("ln_final.hook_normalized", "normalized", "ln_final"):
        return "normalized", None
    if short in CAPTURE_SITES or short == "z":
        return short, None
    parts = name.split(".")
    if len(parts) >= 3 and parts[0] == "blocks":
        try:
            layer = int(parts[1])
        except ValueError:
            layer = None
        rest = ".".join(parts[2:])
        site = rest.removeprefix("attn.hook_") if rest.startswith("attn.") \
            else rest.removeprefix("hook_")
        if layer is not None and (site in LAYER_SITES or site == "z") and (
                rest.startswith("attn.") == (site in ("pattern", "z"))):
            return site, layer
    known = ", ".join(f"blocks.{{l}}.hook_{s}" for s in RESIDUAL_SITES)
    refuse(f"{parameter}: unknown site {name!r}; sites are {known}, "
           "blocks.{l}.attn.hook_pattern, blocks.{l}.attn.hook_z, ln_final.hook_normalized "
           "(or their short forms: resid_post, pattern, ...)", parameter, name)
