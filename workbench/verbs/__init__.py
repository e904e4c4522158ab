"""The research verbs, each said once for both facades: which requests a verb runs and how
their outputs become its result (a "plan"). `workbench.llm.LLM` runs a plan's requests on its
engine, `workbench.workbench.Workbench` on its back end (in the kernel or over HTTP); neither
assembles a result itself.

- `branch`: `BranchPlan`, what if a generated token had been another (`BranchTree`);
- `scores`: `ScorePlan`, given text scored token by token (`LogprobTable`s);
- `compare`: `ComparePlan`, one text through variants of the model (`ModelComparison`);
- `replay`: `ReplayPlan`, one request alone, warm and batched (`DivergenceReport`);
- `beams`: `BeamPlan`, beam searches with their `BeamTree`.
"""
