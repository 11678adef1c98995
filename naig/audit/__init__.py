"""Audit gradient or checkpoint files against a reference (docs/design.md §6).

``stream`` reads safetensors files chunk by chunk with bounded memory; ``run`` scores
each worker file (drift sketch, energy, friction, cosine, Gibbs weight).

Example:
    >>> from naig.audit import AuditConfig
    >>> AuditConfig(beta="1", line="2,3,5").beta, AuditConfig(line="2,3,5").line
    (1.0, (2, 3, 5))
"""

from naig.audit.run import DEFAULT_CHUNK, AuditConfig, AuditResult, FileScore, run_audit

__all__ = ["AuditConfig", "AuditResult", "FileScore", "run_audit", "DEFAULT_CHUNK"]
