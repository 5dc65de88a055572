"""Server profiles, one file each; every one is a ServerProfile (contract.py)."""
from .contract import Post, ProfileContext, ServerProfile, uncarried
from .edge_agent import EdgeAgentProfile
from .screentinker import ScreenTinkerProfile, play_record, screenshot_problem

PROFILES: dict[str, type[ServerProfile]] = {
    EdgeAgentProfile.name: EdgeAgentProfile,
    ScreenTinkerProfile.name: ScreenTinkerProfile,
}

__all__ = ["PROFILES", "EdgeAgentProfile", "Post", "ProfileContext", "ScreenTinkerProfile",
           "ServerProfile", "play_record", "screenshot_problem", "uncarried"]
